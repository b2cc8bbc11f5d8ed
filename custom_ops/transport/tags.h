// Every message tag of the core, in one place: messages between the same
// two ranks of one group match by tag, so two users of a group must never
// share one. Algorithms take the 100s, the setup of process sets the
// 120s, the control plane's own point-to-point rounds the 130s. (The
// failure diagnosis probes over TCP, apart from every group:
// health/fault_report.h.)
#pragma once

namespace ddl {

constexpr int kTagReduceScatter = 101;  // algorithms/ring.cc
constexpr int kTagAllgather = 102;      // algorithms/ring.cc
constexpr int kTagPairwise = 103;       // algorithms/pairwise.cc
constexpr int kTagDirect = 104;         // algorithms/allreduce.cc
constexpr int kTagCounts = 105;         // algorithms/alltoall.cc: the row counts
constexpr int kTagAlltoall = 106;       // algorithms/alltoall.cc: the rows
constexpr int kTagChainUp = 107;        // algorithms/chain_allreduce.cc: partials, up the chain
constexpr int kTagChainDown = 108;      // algorithms/chain_allreduce.cc: results, back down
constexpr int kTagRackScatter = 111;    // algorithms/rack_allreduce.cc: A, inside the rack
constexpr int kTagAcrossScatter = 112;  // algorithms/rack_allreduce.cc: B, across racks
constexpr int kTagAcrossGather = 113;   // algorithms/rack_allreduce.cc: C, across racks
constexpr int kTagRackGather = 114;     // algorithms/rack_allreduce.cc: D, inside the rack
constexpr int kTagRackExchange = 115;   // algorithms/rack_allreduce.cc: small calls
constexpr int kTagSetupOffer = 121;     // engine/set_setup.cc: a rank's word to rank 0
constexpr int kTagSetupVerdict = 122;   // engine/set_setup.cc: rank 0's verdict
constexpr int kTagProbe = 123;          // topology/topology_probe.cc: the rounds' transfers
constexpr int kTagAgreementAnd = 131;   // transport/mpi_transport.cc: the negotiation's AND

}  // namespace ddl
