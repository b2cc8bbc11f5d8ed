#include "thread_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <utility>

#include "../common/config.h"

namespace ddl {

bool EnginePriorityNamed(const std::string& word, EnginePriority* out) {
  static const std::pair<const char*, EnginePriority> kNames[] = {
      {"normal", EnginePriority::kNormal},
      {"high", EnginePriority::kHigh},
      {"auto", EnginePriority::kAuto},
  };
  return ChoiceNamed(kNames, word, out);
}

namespace {

constexpr int kEngineNice = -10;
constexpr uint64_t kEngineSliceNs = 100 * 1000;

// The kernel's struct sched_attr (first version: 48 bytes), declared here
// because older C libraries have neither it nor a sched_setattr wrapper.
struct SchedAttr {
  uint32_t size;
  uint32_t policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime;  // for SCHED_OTHER since Linux 6.12: the requested slice
  uint64_t deadline;
  uint64_t period;
};

}  // namespace

void ClaimEngineThread(EnginePriority priority) {
  pthread_setname_np(pthread_self(), "ddl-engine");
  if (priority != EnginePriority::kHigh) return;
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  // Allowed for root, CAP_SYS_NICE or a permissive RLIMIT_NICE. Measured
  // (docs/PERFORMANCE.md) it hides more than the short slice and the two
  // together, so the slice is only the fallback.
  if (setpriority(PRIO_PROCESS, tid, kEngineNice) == 0) return;
#ifdef SYS_sched_setattr
  SchedAttr attr{};
  attr.size = sizeof(attr);
  attr.policy = SCHED_OTHER;
  attr.nice = getpriority(PRIO_PROCESS, tid);
  attr.runtime = kEngineSliceNs;
  // Older kernels ignore the slice or refuse the call; either is fine.
  syscall(SYS_sched_setattr, 0, &attr, 0);
#endif
}

}  // namespace ddl
