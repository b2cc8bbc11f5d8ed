// The process's running engines: the global one (every rank) and one per
// process set this rank belongs to. Framework bindings (the TensorFlow op
// file, the ctypes C API) reach the engines only through these functions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine.h"

namespace ddl {

// Starts the global engine unless it is running (idempotent).
Status Initialize();
// Stops every engine (idempotent); in-flight collectives fail with Aborted.
void Shutdown();
// The running global engine, or null. Shared so an op racing Shutdown
// stays valid.
std::shared_ptr<Engine> CurrentEngine();

// Collective over every rank of the job, which must all pass the same
// sorted, distinct world ranks: a process set of those ranks, with its own
// engine on its members. *id receives the set's number (the same on every
// rank; the global set is 0).
Status AddProcessSet(const std::vector<int>& ranks, int* id);
// The engine of process set `id` on this rank: null with *why set when
// the set does not exist or this rank is not a member.
std::shared_ptr<Engine> EngineOf(int id, std::string* why);

// Enqueues to process set `set`'s engine, or fails every work (not
// initialised, unknown set, or this rank is not a member). `drive`: the
// caller blocks until the works are done anyway, so it may run the cycles
// itself (Engine::EnqueueAndDrive).
void Submit(std::vector<Work> works, int set = 0, bool drive = false);

// The library under the world's transport (MPI_Get_library_version for MPI).
std::string TransportLibraryVersion();

}  // namespace ddl
