// Names already agreed by all ranks, each with a slot number. Every rank
// applies the same inserts and evictions in the same order, so a slot
// means the same tensor everywhere and the steady state only exchanges one
// bit per slot instead of names and shapes.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

namespace ddl {

class ResponseCache {
 public:
  explicit ResponseCache(int capacity) : capacity_(capacity) {}

  // True (slot in *slot) when the name is cached with compatible metadata;
  // a name cached with other metadata is renegotiated like an unknown one.
  bool Find(const Request& request, int* slot) const;
  bool Contains(const std::string& name) const { return index_.count(name) > 0; }
  // Adds `request` unless present or full; identical calls on every rank
  // give identical slots (lowest free slot first).
  void Insert(const Request& request);
  void Evict(const std::string& name);
  const std::string& NameAt(int slot) const { return slots_[slot]->name; }
  const Request& RequestAt(int slot) const { return *slots_[slot]; }
  bool Occupied(int slot) const { return slots_[slot].has_value(); }
  int num_slots() const { return static_cast<int>(slots_.size()); }

 private:
  int capacity_;
  std::vector<std::optional<Request>> slots_;
  std::unordered_map<std::string, int> index_;
  int occupied_ = 0;
};

}  // namespace ddl
