// The engine thread's claim on a core it shares with the framework's
// compute threads. While a collective is in flight the engine waits in
// short naps between polls (transport/mpi_transport.cc); each wake must
// get the core soon, or the transfer stalls behind the backward pass it
// should be hiding under. With one core per rank, a woken engine thread
// at the compute threads' priority waits for their slice to end: a 50 MB
// allreduce beside a busy core took twice its time alone.
#pragma once

#include <string>

namespace ddl {

// DDL_ENGINE_PRIORITY: how the engine thread claims its core; kAuto is
// kHigh when the job spans several nodes, kNormal on one.
enum class EnginePriority { kNormal, kHigh, kAuto };
// The setting's word by name; false for a word it does not know.
bool EnginePriorityNamed(const std::string& word, EnginePriority* out);

// Names the calling thread "ddl-engine" (as `top -H` shows it) and, for
// kHigh (the caller resolves kAuto), asks the kernel to run it promptly when it wakes: nice -10 where
// the process may raise a priority (root, CAP_SYS_NICE or RLIMIT_NICE),
// otherwise a 100 us scheduling slice, which Linux >= 6.12 turns into an
// earlier deadline (no privilege needed). It only ever uses the core while
// it has work. tests/core/thread_priority_check.cc reads both in /proc.
void ClaimEngineThread(EnginePriority priority);

}  // namespace ddl
