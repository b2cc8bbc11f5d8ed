// engine/thread_priority.h on this machine's kernel: the engine thread's
// name, nice and slice as /proc reports them, for "high" with and without
// the privilege to raise a priority, and for "normal". The privileged case
// runs only as root; the process then gives up root (setresuid to nobody)
// for the unprivileged one. Prints "<N> checks, <F> failures".
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "check.h"
#include "engine/thread_priority.h"

using ddl::EnginePriority;
using ddl_test::Expect;

namespace {

struct Seen {
  std::string name;
  int prio = 0;      // 120 + nice
  long slice = 0;    // ns
};

// Claims a fresh thread (the engine's situation) and reads it back.
Seen ClaimAndRead(EnginePriority priority) {
  Seen seen;
  std::thread t([&] {
    ddl::ClaimEngineThread(priority);
    const std::string task = "/proc/self/task/" + std::to_string(syscall(SYS_gettid));
    std::ifstream(task + "/comm") >> seen.name;
    std::ifstream sched(task + "/sched");
    std::map<std::string, std::string> fields;
    for (std::string line; std::getline(sched, line);) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::istringstream key(line.substr(0, colon)), value(line.substr(colon + 1));
      std::string k, v;
      key >> k;
      value >> v;
      fields[k] = v;
    }
    seen.prio = std::stoi(fields["prio"]);
    seen.slice = fields.count("se.slice") ? std::stol(fields["se.slice"]) : -1;
  });
  t.join();
  return seen;
}

// Linux >= 6.12 honours a SCHED_OTHER thread's requested slice.
bool CustomSlices() {
  utsname u{};
  uname(&u);
  int major = 0, minor = 0;
  std::sscanf(u.release, "%d.%d", &major, &minor);
  return major > 6 || (major == 6 && minor >= 12);
}

}  // namespace

int main() {
  const Seen normal = ClaimAndRead(EnginePriority::kNormal);
  Expect(normal.name == "ddl-engine", "normal: thread named ddl-engine, got " + normal.name);
  Expect(normal.prio == 120, "normal: nice 0, prio " + std::to_string(normal.prio));
  Expect(normal.slice != 100000, "normal: default slice");
  if (geteuid() == 0) {
    const Seen root = ClaimAndRead(EnginePriority::kHigh);
    Expect(root.prio == 110, "high as root: nice -10, prio " + std::to_string(root.prio));
    Expect(root.slice == normal.slice, "high as root: default slice, got " +
                                           std::to_string(root.slice));
    Expect(setresuid(65534, 65534, 65534) == 0, "giving up root");
  }
  const Seen user = ClaimAndRead(EnginePriority::kHigh);
  Expect(user.name == "ddl-engine", "high unprivileged: named");
  Expect(user.prio == 120, "high unprivileged: nice unchanged, prio " + std::to_string(user.prio));
  if (CustomSlices()) {
    Expect(user.slice == 100000, "high unprivileged: 100 us slice, got " +
                                     std::to_string(user.slice));
  }
  return ddl_test::Summary();
}
