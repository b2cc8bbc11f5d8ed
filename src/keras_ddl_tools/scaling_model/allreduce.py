"""Flat and two-level allreduces under the alpha-beta model: ring, recursive
halving-doubling and multi-ring on one kind of link, the flat ring and
halving-doubling over all ranks of several nodes, and the hierarchical
(two-level) algorithm: reduce-scatter in the node, a cross-node step
(ring, halving-doubling, multi-ring or keras_ddl's pairwise step, the
last two also behind rack uplinks), all-gather in the node."""

import math

from .links import Link, _check, _nodes, _rack_count

def ring_allreduce(n, nbytes, link):
    """Ring on n ranks over identical links: a reduce-scatter and an
    all-gather of n-1 steps each, every step moving nbytes/n per rank."""
    _check(n, nbytes)
    if n == 1:
        return 0.0
    return 2 * (n - 1) * link.cost(nbytes / n)


def ring_reduce_scatter(n, nbytes, link, flows=1):
    """Half of the ring allreduce (the all-gather costs the same)."""
    _check(n, nbytes)
    if n == 1:
        return 0.0
    return (n - 1) * link.cost(nbytes / n, flows)


def _halving_doubling_steps(n):
    """Exchange partners' distances of recursive halving (the doubling phase
    mirrors them), and whether n needs the non-power-of-two fold."""
    p = 1 << (int(n).bit_length() - 1)
    distances = []
    d = 1
    while d < p:
        distances.append(d)
        d *= 2
    return distances, p != n


def halving_doubling_allreduce(n, nbytes, link):
    """Recursive halving reduce-scatter + recursive doubling all-gather
    (Rabenseifner): 2*log2(n) steps; step k of each phase moves nbytes/2^k.
    Total: ``2*log2(n)*alpha + 2*(n-1)/n*nbytes*beta`` for a power of two.
    Other n first fold the extra ranks into a power of two and unfold them at
    the end (two more full-size messages)."""
    _check(n, nbytes)
    if n == 1:
        return 0.0
    distances, fold = _halving_doubling_steps(n)
    t = 0.0
    m = float(nbytes)
    for _ in distances:
        m /= 2
        t += 2 * link.cost(m)
    if fold:
        t += 2 * link.cost(nbytes)
    return t


def flat_ring(n, local, nbytes, intra, inter, uplink=None, nodes_per_rack=0):
    """One ring over all n ranks, ordered node by node. Each step every rank
    sends nbytes/n to its successor at once; the step ends when the slowest
    hop does. Across nodes each node has one outgoing ring hop, so its
    network link carries one message per step; with racks (``uplink``, racks
    of ``nodes_per_rack`` nodes) each rack's uplink carries one too."""
    _check(n, nbytes)
    nodes, per_node = _nodes(n, local)
    if n == 1:
        return 0.0
    if nodes == 1:
        return ring_allreduce(n, nbytes, intra)
    step = max(intra.cost(nbytes / n), inter.cost(nbytes / n))
    if uplink is not None and _rack_count(nodes, nodes_per_rack) > 1:
        # ordered rack by rack, each rack has one outgoing ring hop: its
        # uplink carries one message per step
        step = max(step, uplink.cost(nbytes / n))
    return 2 * (n - 1) * step


def flat_halving_doubling(n, local, nbytes, intra, inter):
    """Halving-doubling over all n ranks with node-contiguous rank numbers
    and partner distance growing 1, 2, 4, ...: exchanges at distance < ranks
    per node stay in the node; the others cross the network, all ranks of a
    node at once, so they share the node's link."""
    _check(n, nbytes)
    nodes, per_node = _nodes(n, local)
    if n == 1:
        return 0.0
    if nodes == 1:
        return halving_doubling_allreduce(n, nbytes, intra)
    distances, fold = _halving_doubling_steps(n)
    t = 0.0
    m = float(nbytes)
    for d in distances:
        m /= 2
        hop = intra.cost(m) if d < per_node else inter.cost(m, flows=per_node)
        t += 2 * hop
    if fold:
        t += 2 * inter.cost(nbytes, flows=per_node)
    return t


def _two_factors(n):
    """n = a * b with a <= b as close as possible (a 2-D arrangement)."""
    a = int(math.isqrt(n))
    while n % a:
        a -= 1
    return a, n // a


def multi_ring_allreduce(n, nbytes, link):
    """Rings along the two dimensions of an a x b arrangement of the n ranks
    (a multi-ring / 2-D torus schedule): reduce-scatter along a, then along b
    on the 1/a shard, then the two all-gathers. Same bytes as one ring,
    ``2*(a+b-2)`` latencies instead of ``2*(n-1)``."""
    _check(n, nbytes)
    if n == 1:
        return 0.0
    a, b = _two_factors(n)
    t = ring_reduce_scatter(a, nbytes, link) if a > 1 else 0.0
    t += ring_reduce_scatter(b, nbytes / a, link) if b > 1 else 0.0
    return 2 * t


CROSS_ALGORITHMS = {"ring": ring_allreduce, "halving_doubling": halving_doubling_allreduce,
                    "multi_ring": multi_ring_allreduce}


def pairwise_ring_cross(nodes, nbytes, inter, uplink=None, nodes_per_rack=0):
    """keras_ddl's one-switch step across K nodes (``DDL_ALLREDUCE=flat``
    with one rank per node, the cross step of ``hierarchical``): a pairwise
    reduce-scatter (every node sends nbytes/K to each of the K-1 others in
    one round) and a ring all-gather (K-1 steps of nbytes/K). ``nbytes`` is
    what one node reduces (all its local ranks' shards together). With R
    racks of N nodes, the reduce-scatter sends N(K-N)/K x nbytes through each
    rack's uplink each way; the ring, ordered rack by rack, one message per
    step."""
    _check(nodes, nbytes)
    if nodes == 1:
        return 0.0
    k = nodes
    racks = _rack_count(k, nodes_per_rack) if uplink is not None else 1
    rs = (k - 1) / k * nbytes / inter.bandwidth
    ag_step = nbytes / k / inter.bandwidth
    if racks > 1:
        n_rack = k // racks
        rs = max(rs, n_rack * (k - n_rack) / k * nbytes / uplink.bandwidth)
        ag_step = max(ag_step, nbytes / k / uplink.bandwidth)
    return (k - 1) * inter.alpha + rs + (k - 1) * (inter.alpha + ag_step)


def ring_cross_racks(nodes, nbytes, inter, uplink=None, nodes_per_rack=0):
    """A ring allreduce across K nodes of what one node reduces (nbytes),
    ordered rack by rack: each step a node link and each rack's uplink carry
    nbytes/K."""
    _check(nodes, nbytes)
    if nodes == 1:
        return 0.0
    racks = _rack_count(nodes, nodes_per_rack) if uplink is not None else 1
    step = nbytes / nodes / inter.bandwidth
    if racks > 1:
        step = max(step, nbytes / nodes / uplink.bandwidth)
    return 2 * (nodes - 1) * (inter.alpha + step)


def hierarchical(n, local, nbytes, intra, inter, cross="ring", uplink=None, nodes_per_rack=0):
    """Intra-node reduce-scatter over the L ranks of a node, cross-node
    allreduce of each rank's nbytes/L shard among the ranks with the same
    local rank (L such allreduces run at once and share each node's link),
    intra-node all-gather. ``cross`` names the cross-node algorithm, a key
    of CROSS_ALGORITHMS, or ``pairwise`` (keras_ddl's own cross step,
    ``pairwise_ring_cross``). With ``uplink`` (racks of ``nodes_per_rack``
    nodes behind uplinks) only ``ring`` and ``pairwise`` are modelled: they
    see the uplinks; the others would need their rank order across racks."""
    _check(n, nbytes)
    nodes, per_node = _nodes(n, local)
    if n == 1:
        return 0.0
    t = 2 * ring_reduce_scatter(per_node, nbytes, intra)
    if nodes > 1:
        racked = uplink is not None and _rack_count(nodes, nodes_per_rack) > 1
        if cross == "pairwise":
            return t + pairwise_ring_cross(nodes, nbytes, inter, uplink, nodes_per_rack)
        if racked and cross == "ring":
            return t + ring_cross_racks(nodes, nbytes, inter, uplink, nodes_per_rack)
        if cross not in CROSS_ALGORITHMS:
            raise ValueError(f"unknown cross-node algorithm {cross!r}")
        if racked:
            raise ValueError(f"cross-node algorithm {cross!r} is not modelled behind rack "
                             "uplinks (use ring or pairwise)")
        shard = nbytes / per_node
        shared = Link(inter.alpha, inter.bandwidth / per_node)
        t += CROSS_ALGORITHMS[cross](nodes, shard, shared)
    return t
