// The process's one running engine. Framework bindings (the TensorFlow op
// file, the ctypes C API) reach the engine only through these functions.
#pragma once

#include <memory>

#include "engine.h"

namespace ddl {

// Starts the engine unless it is running (idempotent).
Status Initialize();
// Stops the engine (idempotent); in-flight collectives fail with Aborted.
void Shutdown();
// The running engine, or null. Shared so an op racing Shutdown stays valid.
std::shared_ptr<Engine> CurrentEngine();
// Enqueues, or fails every work with FailedPrecondition if not initialised.
void Submit(std::vector<Work> works);

}  // namespace ddl
