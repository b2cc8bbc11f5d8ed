// The seeded mutation driver: every fuzz target (targets.h) for a bounded
// time, from its corpus (tests/core/fuzz_corpus/<target>/, every file of
// which also runs unchanged: the regression cases) and its seeds, each
// input mutated a few times by a generator seeded from the command line,
// so a finding repeats with the same seed. Built with gcc and
// AddressSanitizer + UndefinedBehaviorSanitizer in the suite.
//
//   driver <corpus root> <seconds per target> <seed> [--write-seeds]
//
// --write-seeds: writes each target's seeds into its corpus folder
// (seed-N) and exits. Each corpus file's outcome is printed as
// "<target>/<file>: decoded" or "<target>/<file>: refused: <message>". Prints "<N> checks, 0 failures" (N: inputs run); a
// finding aborts with the input (targets.h).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "targets.h"

namespace {

// {file name, bytes} of every file of `folder`, by name.
std::vector<std::pair<std::string, std::string>> ReadFolder(const std::string& folder) {
  std::vector<std::pair<std::string, std::string>> files;
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) return files;
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());  // the same order every run: the seed decides
  for (const std::string& name : names) {
    std::ifstream in(folder + "/" + name, std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    files.emplace_back(name, bytes.str());
  }
  return files;
}

// Values that sit on the edges decoders get wrong (counts, lengths, codes).
const uint32_t kEdges[] = {0, 1, 2, 3, 4, 7, 8, 16, 255, 256, 0x7fff, 0xffff, 0x7fffffff,
                           0x80000000, 0xfffffffe, 0xffffffff};

std::string Mutate(std::string s, const std::vector<std::string>& pool, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < rounds; ++i) {
    switch (rng() % 8) {
      case 0:  // flip a bit
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // a random byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
        break;
      case 2: {  // an edge value over 4 bytes (little-endian, as encoded)
        if (s.size() < 4) break;
        uint32_t v = kEdges[pick(sizeof kEdges / sizeof kEdges[0])];
        const size_t at = pick(s.size() - 3);
        for (int b = 0; b < 4; ++b) s[at + b] = static_cast<char>(v >> (8 * b));
        break;
      }
      case 3:  // insert random bytes
        s.insert(pick(s.size() + 1), std::string(1 + pick(8), static_cast<char>(rng())));
        break;
      case 4:  // delete a range
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.erase(at, 1 + pick(s.size() - at));
        }
        break;
      case 5:  // duplicate a range
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.insert(pick(s.size() + 1), s.substr(at, 1 + pick(16)));
        }
        break;
      case 6:  // cut short
        s.resize(pick(s.size() + 1));
        break;
      case 7:  // splice with another input
        if (!pool.empty()) {
          const std::string& other = pool[pick(pool.size())];
          s = s.substr(0, pick(s.size() + 1)) + other.substr(pick(other.size() + 1));
        }
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <corpus root> <seconds per target> <seed> [--write-seeds]\n",
                 argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  const double seconds = std::atof(argv[2]);
  const unsigned long long seed = std::strtoull(argv[3], nullptr, 10);
  const bool write_seeds = argc > 4 && std::string(argv[4]) == "--write-seeds";
  long long runs = 0;
  for (const ddl_fuzz::NamedTarget& t : ddl_fuzz::Targets()) {
    const std::string folder = root + "/" + t.name;
    if (write_seeds) {
      mkdir(folder.c_str(), 0755);
      int n = 0;
      for (const std::string& s : t.seeds()) {
        std::ofstream(folder + "/seed-" + std::to_string(n++), std::ios::binary) << s;
      }
      continue;
    }
    // Every corpus file and seed as it is (regressions), then mutants.
    std::vector<std::string> pool;
    const auto corpus = ReadFolder(folder);
    for (const auto& [name, s] : corpus) {
      const std::string refusal = t.run(reinterpret_cast<const uint8_t*>(s.data()), s.size());
      std::printf("%s/%s: %s\n", t.name, name.c_str(),
                  refusal.empty() ? "decoded" : ("refused: " + refusal).c_str());
      pool.push_back(s);
      ++runs;
    }
    const size_t from_corpus = pool.size();
    for (const std::string& s : t.seeds()) {
      t.run(reinterpret_cast<const uint8_t*>(s.data()), s.size());
      pool.push_back(s);
      ++runs;
    }
    std::mt19937_64 rng(seed ^ std::hash<std::string>()(t.name));
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    long long mutants = 0;
    while (std::chrono::steady_clock::now() < end) {
      for (int i = 0; i < 64; ++i, ++mutants) {
        const std::string input = Mutate(pool[rng() % pool.size()], pool, rng);
        t.run(reinterpret_cast<const uint8_t*>(input.data()), input.size());
      }
    }
    runs += mutants;
    std::printf("%s: %zu corpus files, %lld mutants\n", t.name, from_corpus, mutants);
  }
  std::printf("%lld checks, 0 failures\n", runs);
  return 0;
}
