#include "config.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ddl {

namespace {

Status Invalid(const char* var, const char* value, const std::string& expected) {
  return Status::InvalidArgument(std::string("environment variable ") + var + "='" + value +
                                 "' is invalid: expected " + expected);
}

// Parses a finite number within [low, high]; unset leaves *out unchanged.
Status ReadNumber(const char* var, double low, double high, const std::string& expected,
                  double* out) {
  const char* value = std::getenv(var);
  if (value == nullptr) return Status::Ok();
  char* end = nullptr;
  errno = 0;
  double parsed = std::strtod(value, &end);
  if (end == value || *end != '\0' || errno != 0 || !std::isfinite(parsed) || parsed < low ||
      parsed > high) {
    return Invalid(var, value, expected);
  }
  *out = parsed;
  return Status::Ok();
}

std::string Number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", value);
  return text;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> Config::SharedSettings() const {
  const char* algorithms[] = {"auto", "flat", "hierarchical", "racks"};
  return {
      {"DDL_FUSION_THRESHOLD_MB", Number(fusion_threshold_mb)},
      {"DDL_CACHE_CAPACITY", std::to_string(cache_capacity)},
      {"DDL_ALLREDUCE", algorithms[static_cast<int>(allreduce)]},
      {"DDL_LOCAL_SIZE", local_size > 0 ? std::to_string(local_size) : "unset"},
      {"DDL_SHM_POOL_MB", Number(shm_pool_mb)},
  };
}

Status Config::FromEnvironment(Config* c) {
  Status s;
  if (!(s = ReadNumber("DDL_FUSION_THRESHOLD_MB", 0, 1 << 16,
                       "a number of megabytes between 0 and 65536", &c->fusion_threshold_mb))
           .ok())
    return s;
  if (!(s = ReadNumber("DDL_CYCLE_TIME_MS", 0.01, 10000,
                       "a number of milliseconds between 0.01 and 10000", &c->cycle_time_ms))
           .ok())
    return s;
  if (!(s = ReadNumber("DDL_STALL_WARNING_S", 0.001, 1e9, "a positive number of seconds",
                       &c->stall_warning_s))
           .ok())
    return s;
  if (!(s = ReadNumber("DDL_STALL_TIMEOUT_S", 0, 1e9,
                       "a number of seconds >= 0 (0 disables the timeout)", &c->stall_timeout_s))
           .ok())
    return s;
  if (!(s = ReadNumber("DDL_PEER_TIMEOUT_S", 0, 1e9,
                       "a number of seconds >= 0 (0 disables dead-peer detection)",
                       &c->peer_timeout_s))
           .ok())
    return s;
  if (!(s = ReadNumber("DDL_SHM_POOL_MB", 0, 1 << 20,
                       "a number of megabytes between 0 and 1048576 (0 disables the pool)",
                       &c->shm_pool_mb))
           .ok())
    return s;
  double local_size = c->local_size;
  if (!(s = ReadNumber("DDL_LOCAL_SIZE", 1, 1 << 20, "a whole number of ranks >= 1",
                       &local_size))
           .ok())
    return s;
  if (local_size != std::floor(local_size)) {
    return Invalid("DDL_LOCAL_SIZE", std::getenv("DDL_LOCAL_SIZE"),
                   "a whole number of ranks >= 1");
  }
  c->local_size = static_cast<int>(local_size);
  double capacity = c->cache_capacity;
  if (!(s = ReadNumber("DDL_CACHE_CAPACITY", 0, 1 << 20, "a whole number of entries >= 0",
                       &capacity))
           .ok())
    return s;
  c->cache_capacity = static_cast<int>(capacity);
  double spin = c->spin_polls;
  if (!(s = ReadNumber("DDL_SPIN_POLLS", 0, 1 << 24, "a whole number of polls >= 0", &spin))
           .ok())
    return s;
  if (spin != std::floor(spin)) {
    return Invalid("DDL_SPIN_POLLS", std::getenv("DDL_SPIN_POLLS"), "a whole number of polls >= 0");
  }
  c->spin_polls = static_cast<int>(spin);
  if (const char* algo = std::getenv("DDL_ALLREDUCE")) {
    std::string a(algo);
    if (a == "auto") {
      c->allreduce = AllreduceAlgorithm::kAuto;
    } else if (a == "flat") {
      c->allreduce = AllreduceAlgorithm::kFlat;
    } else if (a == "hierarchical") {
      c->allreduce = AllreduceAlgorithm::kHierarchical;
    } else if (a == "racks") {
      c->allreduce = AllreduceAlgorithm::kRacks;
    } else {
      return Invalid("DDL_ALLREDUCE", algo, "one of auto, flat, hierarchical, racks");
    }
  }
  if (const char* priority = std::getenv("DDL_ENGINE_PRIORITY")) {
    std::string p(priority);
    if (p == "auto") {
      c->engine_priority = EnginePriority::kAuto;
    } else if (p == "high") {
      c->engine_priority = EnginePriority::kHigh;
    } else if (p == "normal") {
      c->engine_priority = EnginePriority::kNormal;
    } else {
      return Invalid("DDL_ENGINE_PRIORITY", priority, "one of auto, high, normal");
    }
  }
  if (const char* path = std::getenv("DDL_TIMELINE")) c->timeline_path = path;
  return Status::Ok();
}

}  // namespace ddl
