#include "runtime.h"

#include <mutex>

namespace ddl {

namespace {
std::mutex& RuntimeMutex() {
  static std::mutex m;
  return m;
}
std::shared_ptr<Engine>& EngineSlot() {
  static std::shared_ptr<Engine> engine;
  return engine;
}
}  // namespace

Status Initialize() {
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  if (EngineSlot()) return Status::Ok();
  std::unique_ptr<Context> ctx;
  Status s = Context::Create(&ctx);
  if (!s.ok()) return s;
  EngineSlot() = std::make_shared<Engine>(std::move(ctx));
  return Status::Ok();
}

void Shutdown() {
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(RuntimeMutex());
    engine.swap(EngineSlot());
  }
  if (engine) engine->Shutdown();
}

std::shared_ptr<Engine> CurrentEngine() {
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  return EngineSlot();
}

void Submit(std::vector<Work> works) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  if (!engine) {
    for (Work& w : works) {
      Finish(w, Status::FailedPrecondition(
                    "keras_ddl is not initialized (or was shut down): call keras_ddl.init() "
                    "before running collective '" + w.name + "'"));
    }
    return;
  }
  engine->Enqueue(std::move(works));
}

}  // namespace ddl
