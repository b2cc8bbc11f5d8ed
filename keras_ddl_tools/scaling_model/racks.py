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
# rack_allreduce.h): an eighth of the call, at least RACK_PIECE and at most
# RACK_MAX_PIECE bytes (before main's 6b9f4ab: always RACK_PIECE).
RACK_PIECE = 1 << 20
RACK_MAX_PIECE = 8 << 20
RACK_PIECES_PER_CALL = 8


def rack_pieces(call_bytes):
    """How many pieces the rack allreduce cuts a call of ``call_bytes`` into:
    ceil(call_bytes / piece) with piece = clamp(call_bytes / 8, 1 MiB,
    8 MiB), i.e. pieces of 1 MiB up to 8 MiB (1 to 8 of them), 8 pieces up
    to 64 MiB, pieces of 8 MiB beyond. Counted without a piece size in
    between, so float rounding cannot add a piece. (The C++ rounds the piece
    down to whole elements, which can leave a ninth piece of a few elements
    between 8 and 64 MiB; the model leaves that out.)"""
    if call_bytes <= 0:
        return 1
    return max(min(math.ceil(call_bytes / RACK_PIECE), RACK_PIECES_PER_CALL),
               math.ceil(call_bytes / RACK_MAX_PIECE))


def rack_allreduce(racks, nbytes, alpha=0.0, piece=None, pieces=None):
    """The three-level (rack) allreduce's cross-node part on one grid of
    ``racks``: P pieces enter the pipeline one step apart and each goes
    through ``racks.stage_links()`` one round per step; P is ``pieces``,
    else ceil(nbytes / piece), else rack_pieces(nbytes) (the C++ rule).
    A step lasts one message latency ``alpha`` plus its most loaded link's
    time: each round of a node-link stage moves node_term / (2P) over the
    node links, each uplink stage uplink_term / (2P) over the uplinks, and
    the rounds active in the same step share their link. In the steady
    state (both node stages and both uplink stages busy) a step lasts
    bound / P, so a large call takes about the bound; the P + stages - 1
    steps include the fill and drain."""
    if nbytes < 0:
        raise ValueError(f"message size must be >= 0 bytes, got {nbytes}")
    if racks.nodes == 1 or nbytes == 0:
        return 0.0
    if not pieces:
        pieces = max(1, math.ceil(nbytes / piece)) if piece else rack_pieces(nbytes)
    share = {"node": racks.node_term(nbytes) / (2 * pieces)}
    if racks.racks > 1:
        share["uplink"] = racks.uplink_term(nbytes) / (2 * pieces)
    stages = racks.stage_links()
    t = 0.0
    for step in range(pieces + len(stages) - 1):
        load = {"node": 0.0, "uplink": 0.0}
        for offset, link in enumerate(stages):
            if 0 <= step - offset < pieces:
                load[link] += share[link]
        t += alpha + max(load.values())
    return t


def three_level(n, local, nbytes, intra, inter, uplink, nodes_per_rack, piece=None):
    """Shared memory (or NVLink) inside the node: reduce-scatter over the L
    local ranks; then each local rank's slice goes through the rack
    allreduce with the same local rank of the other nodes (L grids side by
    side, sharing each node's link and each rack's uplink, so the bound is
    that of the node's whole nbytes); the node's all-gather. Inside-node and
    cross-node parts add up: a node's chunk is not overlapped with the next
    chunk's rack step (docs/topology.md, "Not done yet"). The slice is cut
    into rack_pieces(nbytes / L) pieces, or pieces of ``piece`` bytes (a
    fixed size, e.g. the 1 MiB of runs before the rule)."""
    _check(n, nbytes)
    nodes, per_node = _nodes(n, local)
    if n == 1:
        return 0.0
    t = 2 * ring_reduce_scatter(per_node, nbytes, intra)
    if nodes > 1:
        r = _rack_count(nodes, nodes_per_rack) if uplink is not None else 1
        grid = Racks(r, nodes // r, inter.bandwidth,
                     uplink.bandwidth if uplink is not None else math.inf)
        # one grid per local rank, each on its nbytes/L slice, in pieces;
        # the L grids share the links, so each step moves L pieces
        slice_bytes = nbytes / per_node
        pieces = (max(1, math.ceil(slice_bytes / piece)) if piece
                  else rack_pieces(slice_bytes))
        t += rack_allreduce(grid, nbytes, inter.alpha, pieces=pieces)
    return t
