"""The three-level allreduce: shared memory (or NVLink) in the node, then the
rack allreduce of custom_ops/algorithms/rack_allreduce.cc across nodes
(node links inside a rack, uplinks across racks, pieces pipelined through
its stages), then the node's all-gather."""

import math
from dataclasses import dataclass

from .allreduce import ring_reduce_scatter
from .links import _check, _nodes, _rack_count

@dataclass(frozen=True)
class Racks:
    """R racks of N nodes: each node's link carries ``node_rate`` bytes/s
    each way, each rack's uplink ``uplink_rate``. The oversubscription is
    what the rack's nodes could send at once over what its uplink carries,
    ``N x node_rate / uplink_rate`` (4 means 4:1; 1 a non-blocking
    network)."""
    racks: int
    nodes_per_rack: int
    node_rate: float
    uplink_rate: float

    @property
    def nodes(self):
        return self.racks * self.nodes_per_rack

    @property
    def oversubscription(self):
        return self.nodes_per_rack * self.node_rate / self.uplink_rate

    def node_term(self, nbytes):
        k = self.nodes
        return 2 * (k - 1) / k * nbytes / self.node_rate

    def uplink_term(self, nbytes):
        r = self.racks
        return 2 * (r - 1) / r * nbytes / self.uplink_rate

    def bound(self, nbytes):
        """max(2(K-1)/K x S/B_node, 2(R-1)/R x S/B_uplink): what the slowest
        dimension needs when every level works at once (docs/topology.md)."""
        return max(self.node_term(nbytes), self.uplink_term(nbytes))

    def stage_links(self):
        """The rounds a piece goes through, in order, each named by the
        link it loads: A and D the node links (inside the rack), B and C
        the uplinks (across racks); a dimension of one takes none."""
        node = ["node"] if self.nodes_per_rack > 1 else []
        up = ["uplink", "uplink"] if self.racks > 1 else []
        return node + up + node


# The pieces of algorithms/rack_allreduce.cc (RackPieceBytes in
# rack_allreduce.h): RACK_PIECE bytes, or the whole of a smaller call.
# Small pieces are cheap now that each stage moves a piece on by itself:
# they only shorten the fill and drain, and keep the landing areas (a
# piece per slot) small. (From 0446f4a to the change to fixed pieces the
# rule was a 32nd of the call within 1-2 MiB; no results file kept here
# was measured then.)
RACK_PIECE = 1 << 20
# The rule of the lockstep schedule (6b9f4ab until 0446f4a; 1 MiB always
# before 6b9f4ab): an eighth of the call within 1-8 MiB. The results files
# measured then ran with it (cluster_refit.LOCKSTEP_COMMITS).
LOCKSTEP_MAX_PIECE = 8 << 20
LOCKSTEP_PIECES_PER_CALL = 8
# With several ranks per node, NodeAllreduce (node_allreduce.cc) hands the
# rack allreduce one shared-memory chunk at a time: chunks of
# RACK_CHUNK_BYTES of the call (kRackChunkBytes, engine/context.cc), each
# local rank's slice of a chunk cut into an eighth within 64 KiB-2 MiB
# (RackSlicePieceBytes).
RACK_CHUNK_BYTES = 4 << 20
SLICE_MIN_PIECE = 64 << 10
SLICE_MAX_PIECE = 2 << 20
SLICE_PIECES = 8

SCHEDULES = ("stages", "lockstep")


def rack_pieces(call_bytes, per_call=None, floor=RACK_PIECE, cap=RACK_PIECE):
    """How many pieces the rack allreduce cuts ``call_bytes`` into. By
    default RackPieceBytes: pieces of 1 MiB, ceil(call / 1 MiB). With
    ``per_call``, the older rules: piece = clamp(call / per_call, floor,
    cap), counted as max(min(ceil(call / floor), per_call), ceil(call /
    cap)) without a piece size in between, so float rounding cannot add a
    piece. (The C++ rounds the piece down to whole bytes and elements,
    which can leave one more piece of a few elements; the model leaves
    that out.)"""
    if call_bytes <= 0:
        return 1
    if per_call is None:
        return math.ceil(call_bytes / cap)
    return max(min(math.ceil(call_bytes / floor), per_call), math.ceil(call_bytes / cap))


def lockstep_pieces(call_bytes):
    """The lockstep schedule's rule: clamp(call / 8, 1 MiB, 8 MiB)."""
    return rack_pieces(call_bytes, LOCKSTEP_PIECES_PER_CALL, RACK_PIECE, LOCKSTEP_MAX_PIECE)


def slice_pieces(slice_bytes):
    """The pieces of one local rank's slice of a shared-memory chunk
    (NodeAllreduce::CrossNode): clamp(slice / 8, 64 KiB, 2 MiB). A chunk
    of 4 MiB gives slices of 4 MiB / L, so 8 pieces for L up to 8."""
    return rack_pieces(slice_bytes, SLICE_PIECES, SLICE_MIN_PIECE, SLICE_MAX_PIECE)


def _pieces(nbytes, piece, pieces, schedule):
    if pieces:
        return pieces
    if piece:
        return max(1, math.ceil(nbytes / piece))
    return lockstep_pieces(nbytes) if schedule == "lockstep" else rack_pieces(nbytes)


def rack_allreduce(racks, nbytes, alpha=0.0, piece=None, pieces=None, schedule="stages"):
    """The three-level (rack) allreduce's cross-node part on one grid of
    ``racks``, P pieces through ``racks.stage_links()``; P is ``pieces``,
    else ceil(nbytes / piece), else the schedule's rule (rack_pieces, or
    lockstep_pieces).

    ``schedule="stages"`` (the C++ since 0446f4a): each stage moves a piece
    on as soon as its own round is done, up to 8 pieces in flight per
    stage, so the slower dimension's links stay busy from when the first
    piece reaches them until the last one leaves them:

        T = max(node_term, uplink_term) + min(node_term, uplink_term) / P
            + len(stages) x alpha

    The first term is the bound; the second the fill and drain, one
    piece's rounds on the faster links (uplink-bound: the first piece's A
    before the uplinks start, the last piece's D after they stop, each
    node_term / (2P); node-bound: the last piece's B and C, each
    uplink_term / (2P), charged whole although the node links may still
    have earlier pieces' D rounds to run meanwhile, so there the model
    errs long by up to that much); the third the latency of each round of
    the first and last piece, the other pieces' latencies hidden behind the pieces
    queued on the same link (8 in flight cover a latency many times at
    these rates). One piece gives the sum of its four rounds; one rack
    (no uplink stages) or one node per rack (B and C load the node link
    and the uplink together, no round on faster links alone) the bound.
    The window of 8 pieces and which link a round's messages share with
    other rounds do not appear: the links are taken as sending queued
    messages in order at their full rate.

    ``schedule="lockstep"`` (from 6b9f4ab until 0446f4a, for the refit of
    the results files measured then): the P pieces enter one step apart
    and each goes through the stages one round per step. A step lasts
    ``alpha`` plus its most loaded link's time: a round of a node-link
    stage moves node_term / (2P) over the node links, of an uplink stage
    uplink_term / (2P) over the uplinks, and rounds active in the same
    step share their link; P + stages - 1 steps, the first and last
    stages - 1 partly loaded."""
    if nbytes < 0:
        raise ValueError(f"message size must be >= 0 bytes, got {nbytes}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown rack schedule {schedule!r} ({' or '.join(SCHEDULES)})")
    if racks.nodes == 1 or nbytes == 0:
        return 0.0
    pieces = _pieces(nbytes, piece, pieces, schedule)
    stages = racks.stage_links()
    node = racks.node_term(nbytes)
    up = racks.uplink_term(nbytes) if racks.racks > 1 else 0.0
    if schedule == "stages":
        fill = min(node, up) / pieces if racks.nodes_per_rack > 1 else 0.0
        return max(node, up) + fill + len(stages) * alpha
    share = {"node": node / (2 * pieces), "uplink": up / (2 * pieces)}
    t = 0.0
    for step in range(pieces + len(stages) - 1):
        load = {"node": 0.0, "uplink": 0.0}
        for offset, link in enumerate(stages):
            if 0 <= step - offset < pieces:
                load[link] += share[link]
        t += alpha + max(load.values())
    return t


def three_level(n, local, nbytes, intra, inter, uplink, nodes_per_rack, piece=None,
                schedule="stages"):
    """Shared memory (or NVLink) inside the node: reduce-scatter over the L
    local ranks; then each local rank's slice goes through the rack
    allreduce with the same local rank of the other nodes (L grids side by
    side, sharing each node's link and each rack's uplink, so the bound is
    that of the node's bytes); the node's all-gather. Inside-node and
    cross-node parts add up: a node's chunk is not overlapped with the next
    chunk's rack step (docs/topology.md, "Not done yet").

    One rank per node (L = 1): the whole call goes through the rack
    allreduce, in the schedule's pieces (rack_pieces, lockstep_pieces) or
    pieces of ``piece`` bytes (a fixed size, e.g. the 1 MiB of runs before
    6b9f4ab). L > 1: as NodeAllreduce does, chunk after chunk of
    RACK_CHUNK_BYTES, each a rack allreduce of its own (its own fill,
    drain and latencies) with each slice (chunk / L) in slice_pieces, or
    in pieces of ``piece``."""
    _check(n, nbytes)
    nodes, per_node = _nodes(n, local)
    if n == 1:
        return 0.0
    t = 2 * ring_reduce_scatter(per_node, nbytes, intra)
    if nodes > 1:
        r = _rack_count(nodes, nodes_per_rack) if uplink is not None else 1
        grid = Racks(r, nodes // r, inter.bandwidth,
                     uplink.bandwidth if uplink is not None else math.inf)
        if per_node == 1:
            return t + rack_allreduce(grid, nbytes, inter.alpha, piece=piece,
                                      schedule=schedule)

        # the L grids share the links: each grid's pieces are cut from its
        # slice, but the links carry the node's whole chunk
        def chunk_time(chunk):
            slice_bytes = chunk / per_node
            pieces = (max(1, math.ceil(slice_bytes / piece)) if piece
                      else slice_pieces(slice_bytes))
            return rack_allreduce(grid, chunk, inter.alpha, pieces=pieces, schedule=schedule)

        full = int(nbytes // RACK_CHUNK_BYTES)
        rest = nbytes - full * RACK_CHUNK_BYTES
        t += full * chunk_time(RACK_CHUNK_BYTES) + (chunk_time(rest) if rest > 0 else 0.0)
    return t
