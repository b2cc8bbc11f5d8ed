// The DDL_* environment knobs, parsed and validated once at init. A bad
// value is an error naming the variable and the value, never a silent default.
// Each field's variable, range and scope are a row of settings.def (beside
// this file), the table config.cc and the ddlrun launcher both read.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "types.h"

namespace ddl {

// One of a DDL_CHOICE row's words (settings.def) to the enum value of the
// layer that uses it, by name: `names` is that layer's table of word and
// value. Reordering a row's words changes nothing; a word the table lacks
// returns false (the caller reports it), never another value.
template <typename Enum, size_t N>
bool ChoiceNamed(const std::pair<const char*, Enum> (&names)[N], const std::string& word,
                 Enum* out) {
  for (const auto& [name, value] : names) {
    if (word == name) {
      *out = value;
      return true;
    }
  }
  return false;
}

// The settings hold a choice as its word (checked against the row's list);
// the layer that acts on it reads it by name: DDL_ALLREDUCE in
// topology/choose_allreduce.h, DDL_ENGINE_PRIORITY in
// engine/thread_priority.h, DDL_UPLINK_COMPRESSION in
// topology/choose_allreduce.h (the executor acts on it).
struct Config {
  double fusion_threshold_mb = 128.0;  // DDL_FUSION_THRESHOLD_MB, 0 disables fusion
  double cycle_time_ms = 1.0;         // DDL_CYCLE_TIME_MS
  std::string allreduce = "auto";     // DDL_ALLREDUCE
  int local_size = 0;                 // DDL_LOCAL_SIZE, 0 = detect from the machine
  std::string timeline_path;          // DDL_TIMELINE
  double stall_warning_s = 60.0;      // DDL_STALL_WARNING_S
  double stall_timeout_s = 0.0;       // DDL_STALL_TIMEOUT_S, 0 = never
  int cache_capacity = 1024;          // DDL_CACHE_CAPACITY, 0 disables the response cache
  // DDL_SHM_POOL_MB: per node, the most shared memory that allreduce results
  // may occupy (committed as used); beyond it, and with 0, results are
  // copied out of shared memory into ordinary tensors.
  double shm_pool_mb = 1024.0;
  // DDL_SHM_ARENA_MB: per node, the most shared memory the staging area
  // of the node's allreduce may take (committed at init; 0: the size its
  // path needs, ranks x 4 slots of 256 KiB-4 MiB). Smaller caps make
  // smaller slots, down to 64 KiB; every node uses the same slots.
  double shm_arena_mb = 0.0;
  double peer_timeout_s = 15.0;       // DDL_PEER_TIMEOUT_S, 0 = never: silence => dead peer
  int spin_polls = 50;                // DDL_SPIN_POLLS: busy polls before a wait yields
  std::string engine_priority = "auto";  // DDL_ENGINE_PRIORITY
  // DDL_AUTOTUNE=1: time the network step's candidates on the first
  // allreduce batches and keep the fastest per size class, then the
  // fusion threshold and cycle time (tuning/autotune.h);
  // DDL_AUTOTUNE_STEPS batches per candidate and class, and windows per
  // setting; DDL_AUTOTUNE_CYCLES cycles per window; DDL_AUTOTUNE_FILE:
  // where rank 0 saves the table and finds it again on the next run.
  int autotune = 0;
  std::string uplink_compression = "none";  // DDL_UPLINK_COMPRESSION
  int autotune_steps = 5;
  int autotune_cycles = 5;
  std::string autotune_file;
  // DDL_PRINT_TOPOLOGY=1 (ddlrun --verbose): rank 0 prints the agreed
  // topology and allreduce once at init.
  int print_topology = 0;
  // DDL_JOB_SECRET: 32 hexadecimal digits, the secret a probe must send
  // before a responder answers (common/job_secret.h); rank 0's is used.
  // Empty: rank 0 draws one at set-up.
  std::string job_secret;

  // Reads the environment; fills *config or returns InvalidArgument.
  static Status FromEnvironment(Config* config);

  // The settings every rank must share, as (variable, effective value):
  // those that change what goes on the wire or which group operations a
  // node runs (fusion batches, cache slots, the allreduce path, node
  // groups, the shared result pool). The others (timeline path, engine
  // priority, spin polls, timeouts, cycle time) may differ per rank.
  std::vector<std::pair<std::string, std::string>> SharedSettings() const;
};

// The settings agreement's wire form: what each rank sends rank 0 to
// compare (engine/context.cc), every shared value followed by a NUL (no
// environment value holds one), in SharedSettings' order.
std::vector<char> EncodeSharedValues(const std::vector<std::pair<std::string, std::string>>& settings);
// A rank's bytes back into exactly `count` values. Refused, naming what
// was wrong: another number of values (a build with another settings
// table), a last value without its NUL (bytes cut short), or a value
// longer than any setting's text (kMaxSharedValueBytes).
Status DecodeSharedValues(const std::vector<char>& bytes, size_t count,
                          std::vector<std::string>* values);
constexpr size_t kMaxSharedValueBytes = 4096;

}  // namespace ddl
