#include "runtime.h"

#include <algorithm>
#include <memory>
#include <mutex>

#include "../common/reduce_kernels.h"
#include "../transport/world.h"
#include "engine.h"
#include "set_setup.h"

namespace ddl {

namespace {
std::mutex& RuntimeMutex() {
  static std::mutex m;
  return m;
}
// Index 0: the global engine; index k: process set k's (null where this
// rank is not a member).
std::vector<std::shared_ptr<Engine>>& Engines() {
  static std::vector<std::shared_ptr<Engine>> engines;
  return engines;
}

// The running global engine, or null. Shared so an op racing Shutdown
// stays valid.
std::shared_ptr<Engine> CurrentEngine() {
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  return Engines().empty() ? nullptr : Engines()[0];
}

// The engine of process set `id` on this rank: null with *why set when
// the set does not exist or this rank is not a member.
std::shared_ptr<Engine> EngineOf(int id, std::string* why) {
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  if (Engines().empty() || !Engines()[0]) {
    *why = "keras_ddl is not initialized (or was shut down): call keras_ddl.init() first";
    return nullptr;
  }
  if (id < 0 || id >= static_cast<int>(Engines().size())) {
    *why = "process set " + std::to_string(id) + " does not exist" + Engines()[0]->context().Where();
    return nullptr;
  }
  if (!Engines()[id]) {
    *why = "this rank is not a member of process set " + std::to_string(id) +
           Engines()[0]->context().Where();
    return nullptr;
  }
  return Engines()[id];
}

// ddl_topology's JSON (bindings/c_api.cc documents its fields).
std::string DescribeTopology(const Context& c) {
  const Topology& t = c.topology;
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') q += '\\';
      if (static_cast<unsigned char>(ch) >= 0x20) q += ch;
    }
    return q + "\"";
  };
  auto ints = [](const std::vector<int>& v) {
    std::string a = "[";
    for (size_t i = 0; i < v.size(); ++i) a += (i ? ", " : "") + std::to_string(v[i]);
    return a + "]";
  };
  std::string names = "[";
  for (size_t i = 0; i < t.racks.size(); ++i) names += (i ? ", " : "") + quoted(t.racks[i]);
  names += "]";
  std::string schedule;
  const std::string description = c.DescribeNetwork(&schedule);
  return "{\"racks\": " + names + ", \"rack_of_rank\": " + ints(t.rack_of_rank) +
         ", \"node_of_rank\": " + ints(t.node_of_rank) +
         ", \"nodes_per_rack\": " + std::to_string(t.nodes_per_rack) +
         ", \"source\": " + quoted(t.source) + ", \"used\": " + (c.racks ? "true" : "false") +
         ", \"probe_seconds\": " + std::to_string(t.probe_seconds) +
         ", \"probe_verdict\": " + quoted(t.probe_verdict) +
         ", \"probe_confirmed\": " + (t.probe_confirmed ? "true" : "false") +
         ", \"probe_checks\": " + quoted(t.probe_checks) +
         ", \"probed_by_default\": " + (t.probed_by_default ? "true" : "false") +
         ", \"schedule\": " + quoted(schedule) + ", \"description\": " + quoted(description) +
         "}";
}

}  // namespace

Status Initialize() {
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  if (!Engines().empty() && Engines()[0]) return Status::Ok();
  std::unique_ptr<Group> world;
  Status s = OpenWorld(&world);
  if (!s.ok()) return s;
  std::unique_ptr<Context> ctx;
  s = Context::Create(std::move(world), &ctx);
  if (!s.ok()) return s;
  Engines().assign(1, std::make_shared<Engine>(std::move(ctx)));
  return Status::Ok();
}

void Shutdown() {
  std::vector<std::shared_ptr<Engine>> engines;
  {
    std::lock_guard<std::mutex> lock(RuntimeMutex());
    engines.swap(Engines());
  }
  // The sets' engines first: each stops after a collective step of its own
  // members, which the global engine's shutdown does not wait for.
  for (size_t i = engines.size(); i-- > 0;) {
    if (engines[i]) engines[i]->Shutdown();
  }
}

Status AddProcessSet(const std::vector<int>& ranks, int* id) {
  // One call at a time in this process: the rounds of two threads' calls
  // would otherwise interleave on the setup group.
  static std::mutex calls;
  // Why the setup group fell out of step, once a call failed that way.
  static std::string out_of_step_because;
  std::lock_guard<std::mutex> serial(calls);
  std::shared_ptr<Engine> global = CurrentEngine();
  if (!global) {
    return Status::FailedPrecondition("keras_ddl is not initialized: call keras_ddl.init() "
                                      "before add_process_set");
  }
  const Context& world = global->context();
  const std::string call = "add_process_set([" + RankList(ranks) + "]): ";
  if (!out_of_step_because.empty()) {
    return Status::FailedPrecondition(
        call + "refused: an earlier add_process_set failed with a rank not answering in time (" +
        out_of_step_because + "), so the ranks can no longer agree on new process sets in "
        "this job; end it and restart" + world.Where());
  }
  std::string problem;
  for (size_t i = 0; i < ranks.size() && problem.empty(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world.size) {
      problem = "rank " + std::to_string(ranks[i]) + " is outside [0, " +
                std::to_string(world.size) + ")";
    } else if (i > 0 && ranks[i] <= ranks[i - 1]) {
      problem = "the ranks must be sorted and distinct";
    }
  }
  if (ranks.empty()) problem = "a process set needs at least one rank";
  int next_id = 0;
  {
    std::lock_guard<std::mutex> lock(RuntimeMutex());
    next_id = static_cast<int>(Engines().size());
  }
  // Members build the set's context inside the agreement; its engine
  // starts only once every member has built one.
  std::unique_ptr<Context> ctx;
  auto build = [&](std::unique_ptr<Group> group) {
    return Context::CreateForGroup(std::move(group), next_id, world.config, &ctx);
  };
  bool out_of_step = false;
  Status s;
  try {
    s = SetUpProcessSet(*world.setup, ranks, problem, world.config.peer_timeout_s, build,
                        &out_of_step);
  } catch (const TransportError& e) {
    out_of_step = true;
    s = Status::Aborted(call + e.what());
  }
  if (out_of_step) out_of_step_because = s.message();
  if (!s.ok()) return Status(s.code(), s.message() + world.Where());
  std::shared_ptr<Engine> engine;
  if (ctx) engine = std::make_shared<Engine>(std::move(ctx));
  std::lock_guard<std::mutex> lock(RuntimeMutex());
  *id = next_id;
  Engines().push_back(engine);
  return Status::Ok();
}

void Submit(std::vector<Work> works, int set, bool drive) {
  std::string why;
  std::shared_ptr<Engine> engine = EngineOf(set, &why);
  if (!engine) {
    for (Work& w : works) {
      Finish(w, Status::FailedPrecondition("collective '" + w.name + "': " + why));
    }
    return;
  }
  if (drive) {
    engine->EnqueueAndDrive(std::move(works));
  } else {
    engine->Enqueue(std::move(works));
  }
}

bool Initialized() { return CurrentEngine() != nullptr; }

bool PeerFailureSeen() { return Engine::PeerFailureSeen(); }

bool PlacementIn(int set, Placement* out) {
  std::string why;
  std::shared_ptr<Engine> engine = EngineOf(set, &why);
  if (!engine) return false;
  const Context& c = engine->context();
  *out = {c.rank, c.size, c.local_rank, c.local_size, c.cross_rank, c.cross_size};
  return true;
}

int AllreducePath() {
  std::shared_ptr<Engine> engine = CurrentEngine();
  if (!engine) return -1;
  const Context& c = engine->context();
  return c.racks ? 3 : c.node_memory ? (c.hierarchical ? 2 : 1) : 0;
}

bool TopologyJson(std::string* out) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  if (!engine) return false;
  *out = DescribeTopology(engine->context());
  return true;
}

bool MarkTimeline(const std::string& label) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  if (!engine) return false;
  if (engine->context().timeline) engine->context().timeline->Marker(label);
  return true;
}

bool Traffic(TrafficTotals* out) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  if (!engine) return false;
  const TrafficCounters& t = engine->traffic();
  *out = {t.intra_node_bytes.load(), t.cross_node_bytes.load(), t.flat_bytes.load(),
          t.shared_output_bytes.load(), t.alltoall_bytes.load(), t.rack_bytes.load()};
  return true;
}

bool SettingsInForce(double* fusion_threshold_mb, double* cycle_time_ms) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  if (!engine) return false;
  const AutotuneSetting s = engine->settings();
  *fusion_threshold_mb = s.fusion_threshold_mb;
  *cycle_time_ms = s.cycle_time_ms;
  return true;
}

int ProbePort() {
  std::shared_ptr<Engine> engine = CurrentEngine();
  return engine ? engine->context().peers.Me().port : -1;
}

std::string TransportLibraryVersion() { return WorldLibraryVersion(); }

uint16_t KernelFloatToHalf(float f) { return FloatToHalf(f); }
float KernelHalfToFloat(uint16_t h) { return HalfToFloat(h); }
uint16_t KernelFloatToBFloat16(float f) { return FloatToBFloat16(f); }
float KernelBFloat16ToFloat(uint16_t b) { return BFloat16ToFloat(b); }

}  // namespace ddl
