// Bytes this rank moved, by path, for tests and tools (read from any thread).
#pragma once

#include <atomic>
#include <cstdint>

namespace ddl {

struct TrafficCounters {
  std::atomic<uint64_t> intra_node_bytes{0};  // copied into and out of node shared memory
  std::atomic<uint64_t> cross_node_bytes{0};  // handed to the cross-node allreduce
  std::atomic<uint64_t> flat_bytes{0};        // allreduced by the flat ring over MPI
  std::atomic<uint64_t> shared_output_bytes{0};  // results delivered in node shared memory
  std::atomic<uint64_t> alltoall_bytes{0};       // sent to other ranks by alltoall
  std::atomic<uint64_t> rack_bytes{0};  // allreduced over racks, one rank per node
};

}  // namespace ddl
