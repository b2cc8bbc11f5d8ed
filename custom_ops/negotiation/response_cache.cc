#include "response_cache.h"

namespace ddl {

bool ResponseCache::Find(const Request& request, int* slot) const {
  auto it = index_.find(request.name);
  if (it == index_.end() || !slots_[it->second]->Compatible(request)) return false;
  *slot = it->second;
  return true;
}

void ResponseCache::Insert(const Request& request) {
  if (index_.count(request.name) || occupied_ >= capacity_) return;
  int slot = 0;
  while (slot < num_slots() && slots_[slot].has_value()) ++slot;
  if (slot == num_slots()) slots_.emplace_back();
  slots_[slot] = request;
  index_[request.name] = slot;
  ++occupied_;
}

void ResponseCache::Evict(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  slots_[it->second].reset();
  index_.erase(it);
  --occupied_;
}

}  // namespace ddl
