// What ranks tell the coordinator (Request) and what it answers to all
// (ResponseList), with their byte encodings for the negotiation messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../common/types.h"

namespace ddl {

// One rank's description of a named collective it is ready to run.
// `wire` is resolved (WireDtype); an `invalid` request is never compatible
// with anything.
struct Request : CollectiveSpec {
  int32_t rank = 0;

  // True when two ranks' requests for the same name can run together:
  // everything equal except, for allgather and alltoall, the first
  // dimension, and neither is invalid.
  bool Compatible(const Request& other) const;
  // Human-readable difference from `other`, e.g. "shape [3] vs [4]".
  std::string Difference(const Request& other) const;
};

// The coordinator's answer for one cycle, identical on every rank.
struct ResponseList {
  // Names ready on every rank, in the order every rank executes them.
  std::vector<std::string> ready;
  // Names that cannot run, with the message each rank raises for them.
  std::vector<std::pair<std::string, std::string>> errors;
  // Cache entries to drop before executing (a rank sent a changed request).
  std::vector<std::string> evictions;
  // Non-empty: the job cannot continue (stall timeout); all ranks abort.
  std::string fatal;
  // While some rank has joined (ddl.join): for each name of `ready`, in the
  // same order, a request of a rank that offered it, from which a joined
  // rank builds its stand-in. Empty when no rank has joined.
  std::vector<Request> stand_ins;
};

std::vector<char> EncodeRequests(const std::vector<Request>& requests);
std::vector<Request> DecodeRequests(const std::vector<char>& bytes);
std::vector<char> EncodeResponses(const ResponseList& responses);
ResponseList DecodeResponses(const std::vector<char>& bytes);

}  // namespace ddl
