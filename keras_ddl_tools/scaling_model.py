"""Alpha-beta scaling model of synchronous data-parallel training.

``python -m keras_ddl.bench model`` predicts the scaling efficiency of one
training step at 8 ... 1024 GPUs from

* the cost of an allreduce under the alpha-beta model (a message of m bytes
  over a link costs ``alpha + m * beta``, ``beta = 1 / bandwidth``) for the
  flat ring, recursive halving-doubling and the hierarchical algorithm
  (intra-node reduce-scatter, cross-node allreduce, intra-node all-gather),
  with separate intra-node and inter-node links;
* per-GPU compute time per step and the gradient list of ResNet-50 /
  ResNet-101 (tensor sizes and the point in the backward pass where each
  gradient becomes ready, derived from the architecture);
* overlap of communication with the backward pass, fusion of gradients into
  calls, a fixed software cost per call, negotiation and host staging.

Efficiency is ``t_compute / (t_compute + exposed_comm)``. Every parameter
of a system lives in its ``System`` record in SYSTEMS (printed by the
command); docs/scaling_model.md gives the assumptions and the sources.

This module needs only the standard library (numpy and mpi4py for
``--calibrate``, matplotlib for the plot, all imported lazily), so the model
runs anywhere, without TensorFlow or a launcher.
"""

import dataclasses
import functools
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass

from .rates import parse_rate

GB = 1e9          # bandwidths are in decimal GB/s, as vendors and nccl-tests quote them
US = 1e-6
MS = 1e-3
FP32 = 4          # bytes per gradient element

DEFAULT_GPUS = [8, 16, 32, 64, 128, 256, 512, 1024]
ALGORITHMS = ("ring", "halving_doubling", "hierarchical")


# ---------------------------------------------------------------------------
# Links and the cost of one allreduce
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """One hop: ``alpha`` seconds per message plus ``bytes / bandwidth``.

    ``bandwidth`` is per direction. For the inter-node link it is what one
    node's network interface sustains; ranks of a node that send across nodes
    at the same time share it.
    """
    alpha: float
    bandwidth: float

    @property
    def beta(self):
        return 1.0 / self.bandwidth

    def cost(self, nbytes, flows=1):
        """One message of nbytes while ``flows`` messages share the link."""
        return self.alpha + nbytes * flows * self.beta


def _check(n, nbytes):
    if int(n) != n or n < 1:
        raise ValueError(f"number of ranks must be a positive integer, got {n}")
    if nbytes < 0:
        raise ValueError(f"message size must be >= 0 bytes, got {nbytes}")


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


def _nodes(n, local):
    if local < 1:
        raise ValueError(f"ranks per node must be >= 1, got {local}")
    if n <= local:
        return 1, n
    if n % local:
        raise ValueError(f"{n} ranks do not fill nodes of {local}")
    return n // local, local


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


def _rack_count(nodes, nodes_per_rack):
    """Racks of nodes_per_rack nodes (0: one switch, a single rack)."""
    if not nodes_per_rack or nodes <= nodes_per_rack:
        return 1
    if nodes % nodes_per_rack:
        raise ValueError(f"{nodes} nodes do not fill racks of {nodes_per_rack}")
    return nodes // nodes_per_rack


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


RACK_PIECE = 1 << 20   # bytes of one piece of algorithms/rack_allreduce.cc


def rack_allreduce(racks, nbytes, alpha=0.0, piece=RACK_PIECE, pieces=None):
    """The three-level (rack) allreduce's cross-node part on one grid of
    ``racks``: P = ceil(nbytes / piece) pieces (or ``pieces``) enter the pipeline one step
    apart and each goes through ``racks.stage_links()`` one round per step.
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
    pieces = pieces or max(1, math.ceil(nbytes / piece))
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


def three_level(n, local, nbytes, intra, inter, uplink, nodes_per_rack, piece=RACK_PIECE):
    """Shared memory (or NVLink) inside the node: reduce-scatter over the L
    local ranks; then each local rank's slice goes through the rack
    allreduce with the same local rank of the other nodes (L grids side by
    side, sharing each node's link and each rack's uplink, so the bound is
    that of the node's whole nbytes); the node's all-gather. Inside-node and
    cross-node parts add up: a node's chunk is not overlapped with the next
    chunk's rack step (docs/topology.md, "Not done yet")."""
    _check(n, nbytes)
    nodes, per_node = _nodes(n, local)
    if n == 1:
        return 0.0
    t = 2 * ring_reduce_scatter(per_node, nbytes, intra)
    if nodes > 1:
        r = _rack_count(nodes, nodes_per_rack) if uplink is not None else 1
        grid = Racks(r, nodes // r, inter.bandwidth,
                     uplink.bandwidth if uplink is not None else math.inf)
        # one grid per local rank, each on its nbytes/L slice, in pieces of
        # `piece`; the L grids share the links, so each step moves L pieces
        pieces = max(1, math.ceil(nbytes / per_node / piece))
        t += rack_allreduce(grid, nbytes, inter.alpha, pieces=pieces)
    return t


def allreduce_time(algorithm, n, local, nbytes, intra, inter, cross="ring", uplink=None,
                   nodes_per_rack=0):
    """Seconds for one allreduce of nbytes on n ranks, local ranks per node;
    ``uplink`` and ``nodes_per_rack`` describe racks (None / 0: one switch)."""
    if algorithm == "ring":
        return flat_ring(n, local, nbytes, intra, inter, uplink, nodes_per_rack)
    if algorithm == "halving_doubling":
        if uplink is not None and _rack_count(max(1, n // local), nodes_per_rack) > 1:
            raise ValueError("halving_doubling is not modelled behind rack uplinks")
        return flat_halving_doubling(n, local, nbytes, intra, inter)
    if algorithm == "hierarchical":
        return hierarchical(n, local, nbytes, intra, inter, cross=cross, uplink=uplink,
                            nodes_per_rack=nodes_per_rack)
    if algorithm == "racks":
        return three_level(n, local, nbytes, intra, inter, uplink, nodes_per_rack)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose from "
                     f"{', '.join(ALGORITHMS + ('racks',))}")


# ---------------------------------------------------------------------------
# Workloads: gradient tensors of ResNet-50 / ResNet-101 and when they are ready
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Tensor:
    name: str
    nbytes: int
    ready: float      # fraction of the backward pass done when this gradient exists


@dataclass(frozen=True)
class Workload:
    name: str
    params: int
    macs: int         # multiply-accumulates of one forward pass of one image
    tensors: tuple    # Tensor, in the order the backward pass produces them

    @property
    def nbytes(self):
        return self.params * FP32


_RESNET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}


def _resnet_layers(depth, classes, size=224):
    """(name, weight shape elements, output channels, forward MACs) of every
    layer of ResNet v1 (He et al. 2016, bottleneck blocks, stride on the
    first 1x1 of a block as in the original Caffe model and Keras' ResNet50;
    convolutions without bias, each followed by batch norm)."""
    layers = []
    h = size // 2
    layers.append(("conv1", 7 * 7 * 3 * 64, 64, 7 * 7 * 3 * 64 * h * h))
    h //= 2  # 3x3/2 max pool
    cin = 64
    for stage, (blocks, mid) in enumerate(zip(_RESNET_BLOCKS[depth], (64, 128, 256, 512))):
        out = 4 * mid
        for b in range(blocks):
            ho = h // 2 if (b == 0 and stage > 0) else h
            prefix = f"res{stage + 2}.{b}"
            layers.append((prefix + ".a", cin * mid, mid, cin * mid * ho * ho))
            layers.append((prefix + ".b", 9 * mid * mid, mid, 9 * mid * mid * ho * ho))
            layers.append((prefix + ".c", mid * out, out, mid * out * ho * ho))
            if b == 0:
                layers.append((prefix + ".proj", cin * out, out, cin * out * ho * ho))
            cin, h = out, ho
    layers.append(("fc", cin * classes, None, cin * classes))
    return layers


def resnet(depth, classes=1000, name=None):
    """The gradient list of a ResNet, in backward order, with ready times.

    Assumption (stated in docs/scaling_model.md): the backward pass visits
    layers in reverse and spends time in proportion to each layer's MACs;
    a layer's weight gradient (and its batch-norm gradients) is ready when
    the backward pass has finished that layer."""
    layers = _resnet_layers(depth, classes)
    total = sum(l[3] for l in layers)
    done = 0
    tensors = []
    params = 0
    for lname, weights, channels, macs in reversed(layers):
        done += macs
        ready = done / total
        if channels is None:  # fully connected: weight and bias
            parts = [(lname + ".w", weights), (lname + ".b", classes)]
        else:
            parts = [(lname + ".w", weights), (lname + ".bn.gamma", channels),
                     (lname + ".bn.beta", channels)]
        for pname, count in parts:
            tensors.append(Tensor(pname, count * FP32, ready))
            params += count
    return Workload(name or f"resnet{depth}", params, total, tuple(tensors))


@functools.lru_cache(maxsize=None)
def workload(name):
    """resnet50, resnet101 (1000 classes) or resnet101-22k (21841 classes,
    the ImageNet-22k model of the PowerAI DDL run)."""
    if name == "resnet50":
        return resnet(50)
    if name == "resnet101":
        return resnet(101)
    if name in ("resnet101-22k", "resnet101_22k"):
        return resnet(101, classes=21841, name="resnet101-22k")
    raise ValueError(f"unknown model {name!r}; choose resnet50, resnet101 or resnet101-22k")


MODELS = ("resnet50", "resnet101", "resnet101-22k")


# ---------------------------------------------------------------------------
# Systems: one set of parameters per machine / software stack
# ---------------------------------------------------------------------------

# Of the communication that an ideal schedule would hide behind the backward
# pass, this fraction is actually hidden; the rest lengthens the step. It
# stands for everything the alpha-beta terms leave out while communication
# and backward compute run together: both use the GPU's memory system and
# SMs, the PCIe link and the host CPU, and calls wait for the framework to
# schedule them. One value for every system; docs/scaling_model.md shows how
# the predictions move with it and what value each published point needs.
OVERLAP_FRACTION = 0.7

FUSION_POLICIES = ("tensor", "layer", "cycle", "single")


@dataclass(frozen=True)
class System:
    """Everything the model knows about one cluster and its software."""
    name: str
    description: str
    gpus_per_node: int
    intra: Link                 # between ranks of one node
    inter: Link                 # one node's network link (shared by its ranks)
    resnet50_step: float        # s: one GPU's forward+backward+update, ResNet-50, batch_per_gpu
    batch_per_gpu: int
    algorithm: str = "hierarchical"
    cross: str = "ring"         # cross-node algorithm inside "hierarchical"
    staging: Link = None        # device<->host copy of each call's bytes, both ways, when
                                # the job spans nodes (None: the network reads device memory)
    staging_in_node: bool = False   # the copy is needed inside a node too (host-memory kernels)
    call_overhead: float = 50 * US   # per collective call: dispatch, stream sync, launches
    fusion: str = "layer"       # "tensor": a call per gradient tensor; "layer": per layer;
                                # "cycle": what became ready in one cycle, up to fusion_bytes;
                                # "single": one call for all gradients after the backward pass
    fusion_bytes: int = 0
    cycle: float = 0.0
    negotiation: bool = False   # each call first agrees on what is ready (2*log2(n) latencies)
    backward_fraction: float = 2 / 3
    overlap_fraction: float = OVERLAP_FRACTION
    sources: tuple = ()
    staging_back: Link = None   # host->device copy when it differs from ``staging`` (device->host)
    uplink: Link = None         # each rack's uplink (None: one switch, no racks)
    nodes_per_rack: int = 0
    steps: tuple = ()           # ((model name, measured seconds per step), ...) overriding
                                # the MAC scaling of resnet50_step

    def step_compute(self, work):
        """Per-GPU compute time of one step: a measured step for this model
        if ``steps`` has one, else the ResNet-50 figure scaled by forward
        MACs (same batch per GPU, same efficiency per MAC)."""
        measured = dict(self.steps)
        if work.name in measured:
            return measured[work.name]
        return self.resnet50_step * work.macs / RESNET50_MACS

    def with_(self, **changes):
        return dataclasses.replace(self, **changes)

    def summary(self):
        d = dataclasses.asdict(self)
        d.pop("sources")
        return d


RESNET50_MACS = resnet(50).macs

# ~230 img/s per P100 for ResNet-50 at batch 32: TensorFlow's published
# DGX-1 (P100) figure is 238 img/s at batch 64 (see docs/scaling_model.md).
P100_RESNET50_STEP = 32 / 230.0

# This machine's shared-memory link by default, from BENCHMARKS.md: a numpy
# copy of 64 MB takes ~8 ms here (one core); MPICH's shared-memory latency is
# of the order of a microsecond. ``--calibrate`` measures both.
LOCAL_SHM_DEFAULT = Link(alpha=1.0 * US, bandwidth=64 * 2**20 / (8 * MS))

SYSTEMS = {
    "goyal2017": System(
        name="goyal2017",
        description="Goyal et al. 2017: Big Basin servers, 8 P100 (NVLink) each, "
                    "50 Gbit/s Ethernet; Caffe2, NCCL in a server, Gloo halving-doubling "
                    "across servers",
        gpus_per_node=8,
        intra=Link(alpha=5 * US, bandwidth=20 * GB),       # one NVLink 1.0 link per direction
        inter=Link(alpha=30 * US, bandwidth=5.0 * GB),     # 50 Gb/s = 6.25 GB/s line, TCP ~80%
        staging=Link(alpha=10 * US, bandwidth=12 * GB),    # Gloo's host buffers, PCIe 3.0 x16
        resnet50_step=29 * 3600 / (90 * 1281167 / 256),    # 29 h for 90 epochs on 8 GPUs
        batch_per_gpu=32,
        algorithm="hierarchical", cross="halving_doubling", fusion="layer",
        sources=("Goyal et al. 2017, arXiv:1706.02677: ~90% scaling efficiency from 8 to "
                 "256 GPUs; ResNet-50, batch 8192 on 256 GPUs in one hour",
                 "NVIDIA news 'Facebook trains ImageNet in 1 hour': 29 h -> 1 h, Big Basin "
                 "with 8 P100 on NVLink, NCCL for the local reduction")),
    "powerai_ddl2017": System(
        name="powerai_ddl2017",
        description="Cho et al. 2017 (PowerAI DDL): S822LC 'Minsky' servers, 4 P100 (NVLink) "
                    "each, 100 Gb/s EDR InfiniBand; Caffe + DDL multi-ring",
        gpus_per_node=4,
        intra=Link(alpha=5 * US, bandwidth=20 * GB),       # NVLink 1.0 pairs + X-bus ring
        inter=Link(alpha=5 * US, bandwidth=11 * GB),       # EDR 12.5 GB/s line, MPI ~88%
        staging=Link(alpha=10 * US, bandwidth=32 * GB),    # GPU <-> POWER8 over NVLink
        resnet50_step=P100_RESNET50_STEP,
        batch_per_gpu=32,
        algorithm="hierarchical", cross="multi_ring", fusion="layer",
        sources=("Cho et al. 2017, arXiv:1708.02188: 64 S822LC servers, 256 P100, "
                 "multi-ring communication; ResNet-101 / ImageNet-22k in ~7 h",
                 "IBM Research blog (Hunter, Aug 2017): 95% scaling efficiency with Caffe on "
                 "256 GPUs in 64 Power systems; Facebook 89% with Caffe2",
                 "IBM Systems blog 'Scaling TensorFlow and Caffe to 256 GPUs': ResNet-101 / "
                 "ImageNet-22k 16 days on one 4-GPU server, 7 h on 64",
                 "TensorFlow 1.x benchmarks page: DGX-1 P100, ResNet-50 238 img/s per GPU "
                 "at batch 64")),
    "keras_ddl": System(
        name="keras_ddl",
        description="keras_ddl as built today on GPU servers: CPU kernels (GPU tensors "
                    "staged through host memory), shared memory in a node, ring over MPI "
                    "across nodes on 100 Gb/s EDR InfiniBand",
        gpus_per_node=8,
        intra=LOCAL_SHM_DEFAULT,
        inter=Link(alpha=3 * US, bandwidth=12 * GB),
        staging=Link(alpha=10 * US, bandwidth=10 * GB),    # PCIe 3.0 x16 per GPU
        staging_in_node=True,
        resnet50_step=P100_RESNET50_STEP,
        batch_per_gpu=32,
        algorithm="hierarchical", cross="ring",
        fusion="cycle", fusion_bytes=128 * 2**20, cycle=1 * MS, negotiation=True,
        sources=("BENCHMARKS.md: numpy copy of 64 MB ~8 ms on these machines",
                 "README: DDL_FUSION_THRESHOLD_MB=64, DDL_CYCLE_TIME_MS=1, hierarchical = "
                 "shared memory in a node + ring across nodes")),
}


# ---------------------------------------------------------------------------
# One training step: buckets, the communication stream, exposed time
# ---------------------------------------------------------------------------

def buckets(system, work, t_compute):
    """[(ready_time, nbytes)] of the collective calls of one step, in order.

    Time 0 is the start of the step; the backward pass occupies the last
    ``backward_fraction`` of ``t_compute``."""
    t_back0 = (1 - system.backward_fraction) * t_compute
    timed = [(t_back0 + t.ready * system.backward_fraction * t_compute, t.nbytes)
             for t in work.tensors]
    policy = system.fusion
    if policy == "tensor":
        return timed
    if policy == "single":
        return [(t_compute, sum(b for _, b in timed))]
    if policy == "layer":
        out = []
        for ready, nbytes in timed:
            if out and out[-1][0] == ready:
                out[-1] = (ready, out[-1][1] + nbytes)
            else:
                out.append((ready, nbytes))
        return out
    if policy == "cycle":
        if system.cycle <= 0:
            raise ValueError("fusion='cycle' needs cycle > 0")
        groups = {}
        for ready, nbytes in timed:
            tick = math.ceil(ready / system.cycle - 1e-9) * system.cycle
            groups.setdefault(tick, []).append(nbytes)
        out = []
        limit = system.fusion_bytes
        for tick in sorted(groups):
            size = 0
            for nbytes in groups[tick]:
                if size and limit and size + nbytes > limit:
                    out.append((tick, size))
                    size = 0
                size += nbytes
            out.append((tick, size))
        return out
    raise ValueError(f"unknown fusion policy {policy!r}; choose from {', '.join(FUSION_POLICIES)}")


def call_time(system, algorithm, n, nbytes):
    """One collective call on its own: software overhead, negotiation,
    staging copies and the allreduce itself."""
    if n == 1:
        return 0.0
    nodes = max(1, n // system.gpus_per_node)
    t = system.call_overhead
    t += allreduce_time(algorithm, n, system.gpus_per_node, nbytes, system.intra,
                        system.inter, cross=system.cross, uplink=system.uplink,
                        nodes_per_rack=system.nodes_per_rack)
    if system.negotiation:
        link = system.inter if nodes > 1 else system.intra
        t += 2 * math.ceil(math.log2(n)) * link.alpha
    if system.staging is not None and (nodes > 1 or system.staging_in_node):
        t += system.staging.cost(nbytes) + (system.staging_back or system.staging).cost(nbytes)
    return t


@dataclass
class StepResult:
    gpus: int
    nodes: int
    algorithm: str
    calls: int
    t_compute: float
    t_comm: float       # standalone durations of all collective calls of the step, summed
    exposed: float      # communication time left after the backward pass ends
    allreduce_once: float   # the whole gradient in one call, for reference
    tail: float = 0.0       # ideal schedule: communication after the backward pass
    hideable: float = 0.0   # ideal schedule: communication during the backward pass

    def exposed_at(self, overlap_fraction):
        """Exposed time for another overlap fraction (same schedule)."""
        if self.gpus == 1:
            return 0.0
        return self.tail + (1 - overlap_fraction) * self.hideable

    def efficiency_at(self, overlap_fraction):
        return self.t_compute / (self.t_compute + self.exposed_at(overlap_fraction))

    @property
    def efficiency(self):
        return self.t_compute / (self.t_compute + self.exposed)

    def row(self):
        return {"gpus": self.gpus, "nodes": self.nodes, "algorithm": self.algorithm,
                "calls": self.calls, "t_compute_ms": self.t_compute / MS,
                "t_comm_ms": self.t_comm / MS, "exposed_ms": self.exposed / MS,
                "allreduce_ms": self.allreduce_once / MS, "efficiency": self.efficiency}


def simulate_step(system, work, n, algorithm=None):
    """One training step on n GPUs.

    The collective calls run through one communication stream, one at a
    time, in the order they become ready (as in keras_ddl's background
    thread); a call starts when it is ready and the previous one is done.
    In that ideal schedule, the part of the communication that runs before
    the backward pass ends is hideable; ``overlap_fraction`` of it is
    hidden and the rest is exposed, together with everything that runs
    after the backward pass."""
    algorithm = algorithm or system.algorithm
    t_compute = system.step_compute(work)
    nodes = max(1, n // system.gpus_per_node)
    calls = buckets(system, work, t_compute)
    end = 0.0
    busy = 0.0
    for ready, nbytes in calls:
        d = call_time(system, algorithm, n, nbytes)
        end = max(end, ready) + d
        busy += d
    tail = max(0.0, end - t_compute)
    hideable = busy - tail
    exposed = tail + (1 - system.overlap_fraction) * hideable if n > 1 else 0.0
    once = call_time(system, algorithm, n, work.nbytes)
    return StepResult(n, nodes, algorithm, len(calls), t_compute, busy, exposed, once,
                      tail, hideable)


def predict(system, work, gpus, algorithms=ALGORITHMS):
    return [simulate_step(system, work, n, a) for n in gpus for a in algorithms]


# ---------------------------------------------------------------------------
# Published points
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PublishedPoint:
    label: str
    system: str
    model: str
    gpus: int
    baseline_gpus: int    # the published efficiency is relative to this many GPUs (one server)
    efficiency: float
    source: str


PUBLISHED = (
    PublishedPoint("Goyal et al. 2017, ResNet-50, batch 8192", "goyal2017", "resnet50",
                   256, 8, 0.90,
                   "arXiv:1706.02677 abstract: ~90% scaling efficiency from 8 to 256 GPUs"),
    PublishedPoint("PowerAI DDL 2017, ResNet-50 (Caffe)", "powerai_ddl2017", "resnet50",
                   256, 4, 0.95,
                   "IBM Research blog, Aug 2017 / arXiv:1708.02188: 95% on 256 GPUs"),
    PublishedPoint("PowerAI DDL 2017, ResNet-101, ImageNet-22k", "powerai_ddl2017",
                   "resnet101-22k", 256, 4, 0.88,
                   "arXiv:1708.02188: 88% on 256 GPUs (16 days on 4 GPUs -> 7 h on 256)"),
)


def compare_published(systems=None, points=PUBLISHED):
    """Predicted vs published efficiency, relative to one server as the
    papers report it: ``efficiency(gpus) / efficiency(baseline_gpus)``."""
    systems = systems or SYSTEMS
    rows = []
    for p in points:
        system = systems[p.system]
        work = workload(p.model)
        at = simulate_step(system, work, p.gpus)
        base = simulate_step(system, work, p.baseline_gpus)
        predicted = at.efficiency / base.efficiency
        rows.append({"point": p.label, "system": p.system, "model": p.model, "gpus": p.gpus,
                     "baseline": p.baseline_gpus, "published": p.efficiency,
                     "predicted": predicted, "predicted_abs": at.efficiency,
                     "diff_pts": 100 * (predicted - p.efficiency),
                     "within_5": abs(predicted - p.efficiency) <= 0.05})
    return rows


def overlap_needed(point, systems=None, resolution=0.01):
    """The overlap fraction for which this point's prediction is closest to
    the published value (a diagnostic of how consistent the points are)."""
    systems = systems or SYSTEMS
    work = workload(point.model)
    at = simulate_step(systems[point.system], work, point.gpus)
    base = simulate_step(systems[point.system], work, point.baseline_gpus)
    return _closest_fraction(lambda f: at.efficiency_at(f) / base.efficiency_at(f),
                             point.efficiency, resolution)


def _closest_fraction(efficiency_at, target, resolution=0.01):
    """The overlap fraction on a grid of ``resolution`` in [0, 1] whose
    predicted efficiency ``efficiency_at(f)`` is closest to ``target``."""
    steps = int(round(1 / resolution))
    fractions = [i / steps for i in range(steps + 1)]
    return min(fractions, key=lambda f: abs(efficiency_at(f) - target))


# ---------------------------------------------------------------------------
# The overlap this repository measures on its own test cluster
# ---------------------------------------------------------------------------

def test_cluster_system(link_bits_per_s, step_s, link_efficiency=0.94):
    """The cluster of ``python -m keras_ddl.bench fit --cluster 2``: two
    network namespaces of one rank each (one CPU core, one TF thread), a
    shaped link between them, keras_ddl's flat path. ``link_efficiency`` is
    the fraction of the link rate a 64 MB allreduce reaches there
    (docs/performance-notes/2026-12-03-cluster-allreduce.md); ``step_s`` the
    measured one-rank step."""
    return System(
        name="netns_cluster",
        description=f"2 network namespaces x 1 CPU rank, {link_bits_per_s / 1e9:g} Gbit/s "
                    "links, keras_ddl flat path over MPI/TCP",
        gpus_per_node=1,
        intra=LOCAL_SHM_DEFAULT,
        inter=Link(alpha=100 * US, bandwidth=link_bits_per_s / 8 * link_efficiency),
        resnet50_step=step_s,
        batch_per_gpu=8,
        algorithm="ring", fusion="cycle", fusion_bytes=64 * 2**20, cycle=1 * MS,
        negotiation=True,
        sources=("python -m keras_ddl.bench fit --cluster 2 "
                 "(docs/performance-notes/2026-12-04-fit-across-nodes.md)",))


def half_precision_wire(work):
    """``work`` with every gradient sent in 16 bits (Compression.fp16)."""
    return dataclasses.replace(work, name=work.name + " fp16 wire", tensors=tuple(
        dataclasses.replace(t, nbytes=t.nbytes // 2) for t in work.tensors))


def overlap_from_fit(fit, link_bits_per_s, model="resnet50"):
    """The overlap fraction that reproduces each measured weak-scaling
    efficiency of a ``bench fit --cluster 2 --json`` result (``fit``: its
    parsed JSON), with the model's bounds: efficiency without any overlap
    (f = 0) and with all of it (f = 1). Rows with overlap off have f = 0 by
    construction and are skipped.

    The model describes communication only. A result with the control run
    (``communication``: independent ranks' step / distributed step) is
    fitted on that, with the independent step as the compute time, so what
    the ranks cost each other through the machine does not pass for
    communication that failed to hide; an older result without it is
    fitted on ``efficiency`` against the one-rank step."""
    rows = []
    for r in fit["rows"]:
        if "2x1_ms" not in r:
            raise ValueError("the overlap fit models 2 nodes x 1 rank; this result has no "
                             f"2x1_ms column (columns: {', '.join(r)})")
        if r["overlap"] != "on":
            continue
        work = workload(model)
        if r["wire"] != "fp32":
            work = half_precision_wire(work)
        controlled = "communication" in r
        measured = r["communication"] if controlled else r["efficiency"]
        compute_ms = r["2x1_indep_ms"] if controlled else r["1rank_ms"]
        system = test_cluster_system(link_bits_per_s, compute_ms * MS)
        at = simulate_step(system, work, 2)
        rows.append({"overlap": r["overlap"], "wire": r["wire"],
                     "against": "independent" if controlled else "1 rank", "measured": measured,
                     "model_f0": at.efficiency_at(0.0), "model_f1": at.efficiency_at(1.0),
                     "fitted_f": _closest_fraction(at.efficiency_at, measured)})
    return rows


# ---------------------------------------------------------------------------
# Calibration on this machine
# ---------------------------------------------------------------------------

# BENCHMARKS.md: a bandwidth-optimal 2-rank allreduce through shared memory
# moves about 224 MB of memory traffic per rank for 64 MB of data, while the
# ring formula counts 64 MB sent; a plain copy moves 128 MB of traffic for
# 64 MB. So one byte "sent" by the shared-memory allreduce costs 224/128 of
# a copied byte.
SHM_TRAFFIC_PER_COPY = 224 / 128


def shm_link(copy_bandwidth, alpha):
    """The intra-node link of keras_ddl's shared-memory path, from the
    measured single-core copy bandwidth and small-message latency."""
    return Link(alpha=alpha, bandwidth=copy_bandwidth / SHM_TRAFFIC_PER_COPY)


def _median_time(fn, reps):
    """The median of reps runs, and their (min, max): the machine is shared,
    so the range says how much to trust the median."""
    import statistics
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), (min(times), max(times))


def calibrate(copy_bytes=64 << 20, reps=7, comm=None):
    """Measures this machine's local terms, each the median of several
    runs (with the range in ``*_range``): numpy copy bandwidth and, with two or more MPI ranks, the
    shared-memory MPI latency (ping-pong of 8 bytes between ranks 0 and 1),
    the ping-pong bandwidth of 16 MiB and an mpi4py Allreduce of 16 MiB. All
    ranks must call it; returns a dict on every rank (ranks other than 0 and
    1 only take part in the Allreduce)."""
    import numpy as np

    src = np.ones(copy_bytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    t_copy, copy_range = _median_time(lambda: np.copyto(dst, src), reps)
    result = {"copy_bytes": copy_bytes, "copy_s": t_copy, "copy_s_range": copy_range,
              "copy_GBps": copy_bytes / t_copy / GB,
              "ranks": 1, "loadavg_1min": os.getloadavg()[0], "cpus": os.cpu_count()}
    if comm is None or comm.Get_size() < 2:
        return result
    rank, size = comm.Get_rank(), comm.Get_size()
    result["ranks"] = size

    def pingpong(buf, iters):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            if rank == 0:
                comm.Send(buf, dest=1, tag=7)
                comm.Recv(buf, source=1, tag=7)
            elif rank == 1:
                comm.Recv(buf, source=0, tag=7)
                comm.Send(buf, dest=0, tag=7)
        return (time.perf_counter() - t0) / iters

    small = np.zeros(2, np.float32)
    pingpong(small, 50)
    import statistics
    rtt_small = statistics.median(pingpong(small, 200) for _ in range(5))
    big = np.zeros((16 << 20) // 4, np.float32)
    pingpong(big, 2)
    rtt_big = statistics.median(pingpong(big, 3) for _ in range(3))
    send = np.ones((16 << 20) // 4, np.float32)
    recv = np.empty_like(send)
    from mpi4py import MPI
    comm.Allreduce(send, recv, op=MPI.SUM)
    ar_times = []
    for _ in range(5):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(send, recv, op=MPI.SUM)
        ar_times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    t_ar = statistics.median(ar_times)
    # rank 0's view is the one reported
    rtt_small = comm.bcast(rtt_small, root=0)
    rtt_big = comm.bcast(rtt_big, root=0)
    result.update({
        "mpi_latency_s": rtt_small / 2,
        "mpi_p2p_GBps": 2 * big.nbytes / rtt_big / GB,
        "mpi_allreduce_bytes": send.nbytes,
        "mpi_allreduce_s": t_ar,
        "mpi_allreduce_busbw_GBps": send.nbytes / t_ar * 2 * (size - 1) / size / GB,
    })
    return result


def calibrated_system(system, measured):
    """``system`` with its intra-node link replaced by this machine's
    shared-memory figures."""
    alpha = measured.get("mpi_latency_s", system.intra.alpha)
    link = shm_link(measured["copy_GBps"] * GB, alpha)
    return system.with_(intra=link)


# The keras_ddl system's default intra link is the same formula applied to
# BENCHMARKS.md's reference copy (64 MB in ~8 ms), so --calibrate only
# replaces measured numbers, never the method.
SYSTEMS["keras_ddl"] = SYSTEMS["keras_ddl"].with_(
    intra=shm_link(64 * 2**20 / (8 * MS), LOCAL_SHM_DEFAULT.alpha))


# ---------------------------------------------------------------------------
# Output: tables, JSON, plot
# ---------------------------------------------------------------------------

TABLE_COLUMNS = ["gpus", "nodes", "algorithm", "calls", "t_compute_ms", "t_comm_ms",
                 "exposed_ms", "allreduce_ms", "efficiency"]
PUBLISHED_COLUMNS = ["point", "gpus", "baseline", "published", "predicted", "diff_pts",
                     "within_5", "overlap_needed"]


def _fmt(value):
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def format_table(title, columns, rows):
    cells = [[_fmt(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = [f"# {title}", "  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def parameter_rows(system):
    def link(l):
        return "-" if l is None else f"alpha {l.alpha / US:g} us, {l.bandwidth / GB:.3g} GB/s"
    return [
        {"parameter": "GPUs per node", "value": str(system.gpus_per_node)},
        {"parameter": "intra-node link", "value": link(system.intra)},
        {"parameter": "inter-node link (per node)", "value": link(system.inter)},
        {"parameter": "device<->host staging",
         "value": link(system.staging) + (" (in a node too)" if system.staging is not None
                                          and system.staging_in_node else "")},
        {"parameter": "compute per step (ResNet-50)",
         "value": f"{system.resnet50_step / MS:.1f} ms at batch {system.batch_per_gpu}/GPU"},
        {"parameter": "calls", "value": f"fusion={system.fusion}"
                                        + (f", {system.fusion_bytes >> 20} MB, cycle "
                                           f"{system.cycle / MS:g} ms" if system.fusion == "cycle"
                                           else "")
                                        + f", {system.call_overhead / US:g} us each"
                                        + (", negotiated" if system.negotiation else "")},
        {"parameter": "hierarchical cross-node algorithm", "value": system.cross},
        {"parameter": "backward share of compute", "value": f"{system.backward_fraction:.3g}"},
        {"parameter": "overlap fraction", "value": f"{system.overlap_fraction:g}"},
    ]


def plot(path, system, work, gpus, rows, published_rows, systems):
    """Efficiency vs GPUs: the chosen system per algorithm, and the published
    systems' own configurations against their published points."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed: no plot written (pip install matplotlib)")
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for algorithm in sorted({r["algorithm"] for r in rows}):
        pts = [(r["gpus"], 100 * r["efficiency"]) for r in rows if r["algorithm"] == algorithm]
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=algorithm)
    left.set_title(f"{system.name}, {work.name}: predicted", fontsize=10)
    right_gpus = sorted(set(gpus) | {p["gpus"] for p in published_rows}
                        | {p.baseline_gpus for p in PUBLISHED})
    for point, row in zip(PUBLISHED, published_rows):
        s = systems[point.system]
        w = workload(point.model)
        base = simulate_step(s, w, point.baseline_gpus).efficiency
        xs = sorted({point.baseline_gpus} | {g for g in right_gpus if g >= point.baseline_gpus})
        ys = [100 * simulate_step(s, w, g).efficiency / base for g in xs]
        line, = right.plot(xs, ys, label=f"{point.system} / {point.model} (model)")
        right.scatter([point.gpus], [100 * point.efficiency], color=line.get_color(),
                      marker="*", s=160, zorder=3, edgecolor="black",
                      label=f"published {100 * point.efficiency:.0f}%")
    right.set_title("published systems with their own parameters, relative to one server",
                    fontsize=10)
    for ax, low in ((left, 0), (right, 50)):
        ax.set_xscale("log", base=2)
        ticks = sorted(set(gpus) | set(right_gpus)) if ax is right else sorted(set(gpus))
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("GPUs")
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_ylim(low, 101)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("alpha-beta scaling model (python -m keras_ddl.bench model)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------
# The seeds' scale: measured H200 anchors, refit on the test cluster,
# PowerAI DDL's cluster and an H200 cluster, flat / two-level / three-level
# ---------------------------------------------------------------------------

ANCHORS_PATH = "/work/shared/anchors/gpu-h200.md"

# The figures of the anchors file (measured 2026-12-04 on one H200); a test
# parses the file and checks these, so they cannot drift from it.
H200_ANCHORS = {
    # (model, batch per GPU) -> median step in ms
    "step_ms": {("resnet50", 256): 41.0, ("resnet50", 32): 15.1,
                ("resnet101-22k", 256): 67.7, ("resnet101-22k", 32): 31.0},
    "gradient_bytes": {"resnet50": 102.3e6, "resnet101-22k": 349.2e6},
    # bytes -> ms for (device->host pageable, host->device pageable,
    #                  device->host pinned, host->device pinned)
    "staging_ms": {1e6: (0.14, 0.12, 0.044, 0.043), 16e6: (1.44, 1.53, 0.33, 0.34),
                   102e6: (8.2, 13.1, 1.98, 1.96), 349e6: (27.0, 43.4, 6.8, 6.6)},
    # ranks -> (ms for 102 MB, ms for 349 MB): the CPU shared-memory allreduce probe
    "shm_allreduce_ms": {2: (60.0, 97.0), 4: (39.0, 122.0), 8: (45.0, 157.0),
                         16: (57.0, 225.0)},
}

_MODEL_NAMES = {"ResNet-50": "resnet50", "ResNet-101": "resnet101-22k"}


def _md_rows(text, first_header):
    """The body rows (lists of cells) of the Markdown table whose header
    line starts with ``| first_header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.replace(" ", "").startswith(first_header.replace(" ", "")))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _first_number(cell):
    import re
    return float(re.match(r"\s*([\d.]+)", cell).group(1))


def parse_anchors(text):
    """The figures of the anchors file, in the shape of H200_ANCHORS."""
    out = {"step_ms": {}, "gradient_bytes": {}, "staging_ms": {}, "shm_allreduce_ms": {}}
    for cells in _md_rows(text, "| model | classes"):
        model = _MODEL_NAMES[cells[0]]
        out["step_ms"][(model, int(cells[2]))] = _first_number(cells[3])
        out["gradient_bytes"][model] = _first_number(cells[6]) * 1e6
    for cells in _md_rows(text, "| bytes | device->host"):
        out["staging_ms"][_first_number(cells[0]) * 1e6] = tuple(
            _first_number(c) for c in cells[1:5])
    for cells in _md_rows(text, "| ranks |"):
        out["shm_allreduce_ms"][int(cells[0])] = tuple(_first_number(c) for c in cells[1:3])
    return out


def _two_point_link(t_small, t_large, b_small, b_large):
    """alpha + bytes/bandwidth through two measured (bytes, seconds) points;
    a negative alpha (noise) is taken as 0."""
    bandwidth = (b_large - b_small) / (t_large - t_small)
    return Link(alpha=max(0.0, t_small - b_small / bandwidth), bandwidth=bandwidth)


def h200_staging(kind, anchors=H200_ANCHORS):
    """(device->host, host->device) Links from the anchors' 1 MB and 349 MB
    copies; ``kind`` is 'pageable' or 'pinned'."""
    col = {"pageable": 0, "pinned": 2}[kind]
    table = anchors["staging_ms"]
    small, large = min(table), max(table)
    return tuple(_two_point_link(table[small][col + i] * MS, table[large][col + i] * MS,
                                 small, large) for i in (0, 1))


def h200_shm_link(ranks=8, anchors=H200_ANCHORS):
    """The CPU shared-memory allreduce of the anchors' probe at ``ranks``
    ranks as the model's intra-node link: the bandwidth for which the
    ring's 2(L-1)/L x S per rank fits both measured sizes (least squares
    through the origin; 1 us latency assumed)."""
    t102, t349 = (t * MS for t in anchors["shm_allreduce_ms"][ranks])
    sizes = (anchors["gradient_bytes"]["resnet50"], anchors["gradient_bytes"]["resnet101-22k"])
    moved = [2 * (ranks - 1) / ranks * s for s in sizes]
    times = (t102, t349)
    per_byte = sum(m * t for m, t in zip(moved, times)) / sum(m * m for m in moved)
    return Link(alpha=1 * US, bandwidth=1 / per_byte)


# --- refit on the test cluster ----------------------------------------------

REFIT_PATTERNS = ("cluster_*.json", "racks_*.json")
OBSERVATIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "docs", "model_data", "cluster_observations.json")
RESULTS_DIR = os.path.join(os.path.dirname(OBSERVATIONS), os.pardir, "results")
# Sizes the refit takes: up to 16 KB (below the test cluster's 256 KB token
# bucket the link is not the limit, so the time is the per-call cost) and
# from 1 MB (the link is); in between the bucket lets part of a call through
# at once and neither term describes it.
REFIT_SMALL_BYTES = 16 << 10
REFIT_MIN_BYTES = 1 << 20


def _refit_size(nbytes):
    return nbytes <= REFIT_SMALL_BYTES or nbytes >= REFIT_MIN_BYTES


def _fit_bound(obs):
    """The links' share of an observation in the refit: none for the small
    calls the token bucket passes at once, observation_bound otherwise."""
    return 0.0 if obs["size"] <= REFIT_SMALL_BYTES else observation_bound(obs)


def _parse_shape(shape):
    """'KxL' -> (K nodes, L per node, 1 rack); 'RxNxL' -> (R*N, L, R)."""
    parts = [int(p) for p in shape.lower().split("x")]
    if len(parts) == 2:
        return parts[0], parts[1], 1
    return parts[0] * parts[1], parts[2], parts[0]


def observation_bound(obs):
    """The model's time for one observation's call with the links at their
    full rate and no latency or overhead: the algorithm's bytes over the
    links, fill and drain of the rack pipeline included."""
    nodes, per_node, racks = _parse_shape(obs["shape"])
    node = Link(0.0, parse_rate(obs["rate"]) / 8)
    uplink = Link(0.0, parse_rate(obs["uplink"]) / 8) if obs.get("uplink") else None
    npr = nodes // racks if racks > 1 else 0
    if obs["path"] == "racks":
        return three_level(nodes, 1, obs["size"], node, node, uplink, npr)
    if obs["path"] == "two_level":
        return pairwise_ring_cross(nodes, obs["size"], node, uplink, npr)
    raise ValueError(f"unknown path {obs['path']!r} (two_level or racks)")


def _size_bytes(key):
    from .rates import parse_size
    return parse_size(key.replace("B", "b"), "size")


def observations_from_results(directory, files=None):
    """Observations from every docs/results file named cluster_*.json or
    racks_*.json in ``directory`` (or from ``files``), results of ``bench
    allreduce --cluster`` through ``keras_ddl_tools.results``: the first
    algorithm's median (auto) and, with racks, the two-level path's
    (``flat``); sizes as REFIT_SMALL_BYTES / REFIT_MIN_BYTES say."""
    import glob
    out = []
    paths = list(files) if files is not None else [
        p for pattern in REFIT_PATTERNS for p in sorted(glob.glob(os.path.join(directory,
                                                                               pattern)))]
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        launch = data["launches"][0]
        racks = int(launch.get("racks", 1) or 1)
        nodes, per_node = int(launch["nodes"]), int(launch["ranks_per_node"])
        shape = (f"{racks}x{nodes // racks}x{per_node}" if racks > 1
                 else f"{nodes}x{per_node}")
        if per_node != 1:
            continue   # the fit models one rank per node (no shared-memory stage)
        for row in data["tables"]["rows"]:
            size = _size_bytes(row["key"])
            if not _refit_size(size):
                continue
            columns = [("auto_us", "racks" if racks > 1 else "two_level"),
                       ("flat_us", "two_level")]
            for column, path_name in columns:
                if column not in row or (column == "flat_us" and racks == 1):
                    continue
                out.append({"shape": shape, "rate": launch["rate"],
                            "uplink": launch.get("uplink") if racks > 1 else None,
                            "path": path_name, "size": size,
                            "time_s": row[column]["median"] / 1e6,
                            "launches": len(data["launches"]),
                            "source": f"docs/results/{os.path.basename(path)}, "
                                      f"{column[:-3]}"})
    return out


def load_observations(paths=None, results_dir=None):
    """(observations, where they came from): the results files matching
    REFIT_PATTERNS if any, else docs/model_data/cluster_observations.json;
    ``paths``: explicit JSON files of either kind."""
    if paths:
        obs = []
        for path in paths:
            with open(path) as f:
                data = json.load(f)
            if "observations" in data:
                obs += data["observations"]
            else:
                obs += observations_from_results(None, [path])
        return obs, ", ".join(paths)
    results_dir = results_dir or RESULTS_DIR
    obs = observations_from_results(results_dir)
    if obs:
        return obs, f"docs/results/{{{','.join(REFIT_PATTERNS)}}}"
    with open(OBSERVATIONS) as f:
        return json.load(f)["observations"], "docs/model_data/cluster_observations.json"


@dataclass(frozen=True)
class Refit:
    link_efficiency: float    # fraction of the link rates the algorithms reach
    call_overhead: float      # s per call on top of the links' time
    residuals: tuple          # (measured / fitted - 1) per observation
    observations: tuple
    source: str

    @property
    def spread(self):
        """The largest |measured / fitted - 1|."""
        return max(abs(r) for r in self.residuals)

    @property
    def rms(self):
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals))


def refit(observations, source="given"):
    """Least squares of ``time = call_overhead + bound / link_efficiency``
    over the observations, each weighted by 1/time (relative errors), with
    ``bound`` the model's time at full link rate (observation_bound);
    call_overhead is kept >= 0."""
    obs = [o for o in observations if _refit_size(o["size"])]
    if len(obs) < 2:
        raise ValueError(f"the refit needs at least 2 observations (up to 16 KB or from "
                         f"1 MB), got {len(obs)}")
    xs = [_fit_bound(o) for o in obs]
    ts = [o["time_s"] for o in obs]
    if min(ts) <= 0:
        raise ValueError("every observed time must be positive")
    ws = [1 / t for t in ts]
    # weighted normal equations for t = c + b*x
    s11 = sum(w * w for w in ws)
    s12 = sum(w * w * x for w, x in zip(ws, xs))
    s22 = sum(w * w * x * x for w, x in zip(ws, xs))
    r1 = sum(w * w * t for w, t in zip(ws, ts))
    r2 = sum(w * w * x * t for w, x, t in zip(ws, xs, ts))
    det = s11 * s22 - s12 * s12
    if det <= 0:
        raise ValueError("the observations do not determine both parameters (one size only?)")
    c = (r1 * s22 - s12 * r2) / det
    b = (s11 * r2 - s12 * r1) / det
    if c < 0:   # no negative overhead: the best fit with c = 0
        c, b = 0.0, r2 / s22
    if b <= 0:
        raise ValueError(f"fitted time per bound second {b:.3g} <= 0")
    residuals = tuple(t / (c + b * x) - 1 for x, t in zip(xs, ts))
    return Refit(1 / b, c, residuals, tuple(obs), source)


def refit_rows(fit):
    rows = []
    for o, r in zip(fit.observations, fit.residuals):
        bound = _fit_bound(o)
        rows.append({"shape": o["shape"], "rates": o["rate"] + ("/" + o["uplink"]
                                                               if o.get("uplink") else ""),
                     "path": o["path"], "size_MB": o["size"] / 2**20,
                     "measured_ms": o["time_s"] / MS, "bound_ms": bound / MS,
                     "fitted_ms": (fit.call_overhead + bound / fit.link_efficiency) / MS,
                     "residual": f"{100 * r:+.1f}%", "launches": o.get("launches", "?")})
    return rows


# --- systems at the seeds' scale ----------------------------------------------

@dataclass(frozen=True)
class SeedSetup:
    """The knobs of one seeds' prediction."""
    seeds: str = "p100"            # p100: 64 servers x 4 P100; h200: 32 servers x 8 H200
    node_rate: float = None        # bits/s each way per server (default 100 Gb/s / 400 Gb/s)
    nodes_per_rack: int = None     # default 16 (P100) / 8 (H200)
    uplink_ratio: float = 4.0      # oversubscription: nodes_per_rack x node rate / uplink rate
    batch: int = None              # per GPU: 32 (P100) / 256 (H200)
    link_efficiency: float = 0.9
    call_overhead: float = None    # s per call for CPU data plane systems (None: refit's / 50 us)
    gpu_call_overhead: float = 50 * US
    overlap_fraction: float = OVERLAP_FRACTION

    @property
    def servers(self):
        return 64 if self.seeds == "p100" else 32

    @property
    def gpus_per_server(self):
        return 4 if self.seeds == "p100" else 8

    def rate(self):
        return self.node_rate or (100e9 if self.seeds == "p100" else 400e9)

    def rack_nodes(self):
        return self.nodes_per_rack or (16 if self.seeds == "p100" else 8)

    def per_gpu_batch(self):
        return self.batch or (32 if self.seeds == "p100" else 256)


SEED_SYSTEMS = {"p100": ("p100_gpu", "p100_cpu"),
                "h200": ("h200_gpu", "h200_pinned", "h200_pageable")}
SEED_MODELS = {"p100": ("resnet50",), "h200": ("resnet50", "resnet101-22k")}
# (label, algorithm, cross): flat = one ring over every GPU; two-level =
# NVLink / shared memory in the server and keras_ddl's pairwise step
# across servers (or a ring); three-level = the rack allreduce
SEED_ALGORITHMS = (("flat ring", "ring", "ring"),
                   ("two-level, pairwise", "hierarchical", "pairwise"),
                   ("two-level, ring", "hierarchical", "ring"),
                   ("three-level (racks)", "racks", "pairwise"))


def seed_system(name, setup, node_rate=None, uplink_rate=None):
    """One of the SEED_SYSTEMS as a System, its network at ``node_rate``
    bits/s per server (default the setup's) and rack uplinks at
    ``uplink_rate`` (default nodes_per_rack x node rate / uplink_ratio),
    both times the link efficiency."""
    rate = node_rate or setup.rate()
    npr = setup.rack_nodes()
    uplink_rate = uplink_rate or npr * rate / setup.uplink_ratio
    eff = setup.link_efficiency
    inter = Link(alpha=3 * US, bandwidth=rate / 8 * eff)
    uplink = Link(alpha=3 * US, bandwidth=uplink_rate / 8 * eff)
    cpu_overhead = setup.call_overhead if setup.call_overhead is not None else 50 * US
    batch = setup.per_gpu_batch()
    common = dict(inter=inter, uplink=uplink, nodes_per_rack=npr, algorithm="racks",
                  cross="pairwise", fusion="cycle", fusion_bytes=128 * 2**20, cycle=1 * MS,
                  negotiation=True, batch_per_gpu=batch,
                  overlap_fraction=setup.overlap_fraction)
    if name.startswith("p100"):
        common.update(gpus_per_node=4, resnet50_step=P100_RESNET50_STEP * batch / 32)
        if name == "p100_gpu":
            return System(name=name, description="64 x 4 P100 (PowerAI DDL's servers), GPU "
                          "data plane: NVLink in the server, EDR-class InfiniBand across",
                          intra=Link(alpha=5 * US, bandwidth=20 * GB),
                          call_overhead=setup.gpu_call_overhead, **common)
        return System(name=name, description="64 x 4 P100, keras_ddl's CPU data plane: "
                      "gradients staged to POWER8 memory over NVLink, shared memory in the "
                      "server", intra=SYSTEMS["keras_ddl"].intra,
                      staging=Link(alpha=10 * US, bandwidth=32 * GB), staging_in_node=True,
                      call_overhead=cpu_overhead, **common)
    steps = tuple((m, H200_ANCHORS["step_ms"][(m, batch)] * MS) for m in SEED_MODELS["h200"]
                  if (m, batch) in H200_ANCHORS["step_ms"])
    if not steps:
        raise ValueError(f"the H200 anchors have batch 32 and 256 per GPU, not {batch}")
    common.update(gpus_per_node=8, resnet50_step=dict(steps)["resnet50"], steps=steps)
    if name == "h200_gpu":
        return System(name=name, description="32 x 8 H200, GPU data plane: NVLink in the "
                      "server (assumed 360 GB/s per direction), network across",
                      intra=Link(alpha=5 * US, bandwidth=360 * GB),
                      call_overhead=setup.gpu_call_overhead, **common)
    d2h, h2d = h200_staging(name.split("_")[1])
    return System(name=name, description=f"32 x 8 H200, keras_ddl's CPU data plane: "
                  f"{name.split('_')[1]} staging (anchors), shared memory in the server "
                  "(anchors' 8-rank probe)", intra=h200_shm_link(8), staging=d2h,
                  staging_back=h2d, staging_in_node=True, call_overhead=cpu_overhead, **common)


def seed_efficiency(system, work, gpus, algorithm, cross, against="server"):
    """Efficiency at ``gpus``; ``against`` 'server': relative to one server
    (as PowerAI and Goyal et al. report), 'gpu': absolute."""
    s = system.with_(cross=cross)
    at = simulate_step(s, work, gpus, algorithm).efficiency
    if against == "gpu":
        return at
    return at / simulate_step(s, work, system.gpus_per_node, algorithm).efficiency


def solve_rate(efficiency_at, target, lo=1e8, hi=1e14, rel_tol=1e-3):
    """The lowest rate (bits/s, bisection on a log scale) at which
    ``efficiency_at(rate) >= target``, assuming efficiency does not fall as
    the rate rises; None when even ``hi`` does not reach it, ``lo`` when
    ``lo`` already does."""
    if efficiency_at(hi) < target:
        return None
    if efficiency_at(lo) >= target:
        return lo
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if efficiency_at(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def _systems_algorithms(seeds):
    """(system name, label, algorithm, cross) rows of a seeds table: every
    algorithm on the GPU data plane, the one keras_ddl picks with racks on
    the CPU data plane."""
    rows = []
    for name in SEED_SYSTEMS[seeds]:
        algos = SEED_ALGORITHMS if name.endswith("_gpu") else (SEED_ALGORITHMS[-1],)
        rows += [(name, label, a, c) for label, a, c in algos]
    return rows


def seeds_table(setup):
    """Efficiency of each system and algorithm at the seeds' scale, at 1:1
    and at the setup's oversubscription."""
    gpus = setup.servers * setup.gpus_per_server
    rows = []
    for model in SEED_MODELS[setup.seeds]:
        work = workload(model)
        for name, label, algorithm, cross in _systems_algorithms(setup.seeds):
            one = seed_system(name, dataclasses.replace(setup, uplink_ratio=1.0))
            over = seed_system(name, setup)
            t = one.step_compute(work)
            rows.append({
                "model": model, "system": name, "algorithm": label,
                "step_ms": t / MS,
                "one_server": seed_efficiency(one, work, one.gpus_per_node, algorithm, cross,
                                              "gpu"),
                "rel_1to1": seed_efficiency(one, work, gpus, algorithm, cross),
                f"rel_{setup.uplink_ratio:g}to1": seed_efficiency(over, work, gpus, algorithm,
                                                                  cross),
                "abs_1to1": seed_efficiency(one, work, gpus, algorithm, cross, "gpu"),
                f"abs_{setup.uplink_ratio:g}to1": seed_efficiency(over, work, gpus, algorithm,
                                                                  cross, "gpu")})
    return rows


def seeds_rates(setup, target=0.9, against="server"):
    """Per system and algorithm: the server link rate reaching ``target`` at
    1:1 and at the setup's oversubscription (uplinks scale with it), and
    the uplink rate reaching it with the servers at the setup's rate."""
    gpus = setup.servers * setup.gpus_per_server
    rows = []
    npr = setup.rack_nodes()
    for model in SEED_MODELS[setup.seeds]:
        work = workload(model)
        for name, label, algorithm, cross in _systems_algorithms(setup.seeds):
            def at_ratio(ratio):
                s = dataclasses.replace(setup, uplink_ratio=ratio)
                return lambda r: seed_efficiency(seed_system(name, s, node_rate=r), work, gpus,
                                                 algorithm, cross, against)
            uplink = solve_rate(lambda u: seed_efficiency(
                seed_system(name, setup, uplink_rate=u), work, gpus, algorithm, cross,
                against), target)
            def absolute(r):
                s = seed_system(name, setup, node_rate=r)
                return seed_efficiency(s, work, gpus, algorithm, cross, "gpu")
            rows.append({"model": model, "system": name, "algorithm": label,
                         "server_1to1": solve_rate(at_ratio(1.0), target),
                         f"server_{setup.uplink_ratio:g}to1_absolute": solve_rate(absolute,
                                                                                  target),
                         f"server_{setup.uplink_ratio:g}to1": solve_rate(
                             at_ratio(setup.uplink_ratio), target),
                         "uplink": uplink,
                         "uplink_ratio": (None if uplink is None
                                          else npr * setup.rate() / uplink)})
    return rows


def _gbit(rate):
    if rate is None:
        return "not reached"
    if rate <= 1e8:
        return "<= 0.1"
    return f"{rate / 1e9:.3g}"


def seeds_markdown(setup, target=0.9, against="server"):
    """The seeds' tables as Markdown (what docs/scaling_model.md shows)."""
    ratio = f"{setup.uplink_ratio:g}:1"
    pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
    size = f"{setup.servers} x {setup.gpus_per_server}"
    out = [f"| model | system | algorithm | step (ms) | one server (absolute) | {size}, 1:1 | "
           f"{size}, {ratio} | {size}, {ratio}, absolute |", "|---|---|---|---|---|---|---|---|"]
    for r in seeds_table(setup):
        out.append(f"| {r['model']} | {r['system']} | {r['algorithm']} | {r['step_ms']:.1f} | "
                   f"{pct(r['one_server'])} | {pct(r['rel_1to1'])} | "
                   f"{pct(r[f'rel_{setup.uplink_ratio:g}to1'])} | "
                   f"{pct(r[f'abs_{setup.uplink_ratio:g}to1'])} |")
    if setup.seeds == "p100":
        (ddl,) = [r for r in compare_published() if r["system"] == "powerai_ddl2017"
                  and r["model"] == "resnet50"]
        out += ["", f"PowerAI DDL 2017 on the same cluster (ResNet-50, 256 GPUs against one "
                    f"server): published {pct(ddl['published'])}%; its own system in this "
                    f"model (`powerai_ddl2017`: multi-ring across 64 servers, a call per "
                    f"layer, staging through POWER8 memory, no racks) {pct(ddl['predicted'])}%."]
    basis = "relative to one server" if against == "server" else "absolute (against one GPU)"
    out += ["", f"Link rate for {100 * target:g}% ({basis}; last column absolute), Gbit/s "
                "each way:", "",
            f"| model | system | algorithm | per server, 1:1 | per server, {ratio} | "
            f"uplink with servers at {setup.rate() / 1e9:g} | = oversubscription | "
            f"per server, {ratio}, absolute |", "|---|---|---|---|---|---|---|---|"]
    for r in seeds_rates(setup, target, against):
        ov = "-" if r["uplink_ratio"] is None else f"{r['uplink_ratio']:.3g}:1"
        out.append(f"| {r['model']} | {r['system']} | {r['algorithm']} | "
                   f"{_gbit(r['server_1to1'])} | "
                   f"{_gbit(r[f'server_{setup.uplink_ratio:g}to1'])} | {_gbit(r['uplink'])} | "
                   f"{ov} | {_gbit(r[f'server_{setup.uplink_ratio:g}to1_absolute'])} |")
    return "\n".join(out)


SEEDS_BLOCK = r"(<!-- seeds:(?P<seeds>\w+) -->\n)(?P<body>.*?)(<!-- /seeds:(?P=seeds) -->)"


def render_seeds_blocks(text, setups, target=0.9, against="server"):
    """``text`` with every ``<!-- seeds:p100 -->`` ... ``<!-- /seeds:p100 -->``
    block (p100 or h200) replaced by seeds_markdown of that setup."""
    import re

    def body(match):
        return (match.group(1) + seeds_markdown(setups[match.group("seeds")], target, against)
                + "\n" + match.group(4))
    return re.sub(SEEDS_BLOCK, body, text, flags=re.S)


def seeds_plot(path, setups, target=0.9):
    """Efficiency against the per-server link rate, one panel per setup,
    solid at 1:1 and dashed at the setup's oversubscription: P100 relative
    to one server (PowerAI DDL's published 95% marked), H200 absolute
    (against one GPU without communication), so the CPU data plane's loss
    inside a server shows. ResNet-101/22k thin, ResNet-50 thick."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed: no plot written (pip install matplotlib)")
        return False
    fig, axes = plt.subplots(1, len(setups), figsize=(6.4 * len(setups), 5.0))
    axes = list(axes) if len(setups) > 1 else [axes]
    rates = [10 ** (8.5 + 0.125 * i) for i in range(33)]   # 0.3 Gbit/s ... 3.2 Tbit/s
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, setup in zip(axes, setups):
        gpus = setup.servers * setup.gpus_per_server
        against = "server" if setup.seeds == "p100" else "gpu"
        combos = [c for c in _systems_algorithms(setup.seeds) if c[1] != "two-level, ring"]
        for model in SEED_MODELS[setup.seeds]:
            work = workload(model)
            thick = model == "resnet50"
            for i, (name, label, algorithm, cross) in enumerate(combos):
                color = palette[i % len(palette)]
                for ratio, style in ((1.0, "-"), (setup.uplink_ratio, "--")):
                    s = dataclasses.replace(setup, uplink_ratio=ratio)
                    ys = [100 * seed_efficiency(seed_system(name, s, node_rate=r), work, gpus,
                                                algorithm, cross, against) for r in rates]
                    kw = {"label": f"{model}, {name}, {label}"} if ratio == 1.0 else {}
                    ax.plot([r / 1e9 for r in rates], ys, style, color=color,
                            lw=2.0 if thick else 0.9, **kw)
        ax.axhline(100 * target, color="grey", lw=0.8)
        ax.axvline(setup.rate() / 1e9, color="grey", lw=0.8, ls=":")
        if setup.seeds == "p100":
            ax.scatter([100], [95], marker="*", s=180, color="gold", edgecolor="black",
                       zorder=3, label="PowerAI DDL 2017, published 95% (EDR, 100 Gbit/s)")
        ax.set_xscale("log")
        ax.set_xlabel("link rate per server, Gbit/s each way")
        ax.set_ylabel("efficiency relative to one server (%)" if against == "server"
                      else "efficiency against one GPU alone (%)")
        ax.set_ylim(0, 101)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{setup.servers} servers x {setup.gpus_per_server} "
                     f"{setup.seeds.upper()}, racks of {setup.rack_nodes()}: solid 1:1, "
                     f"dashed {setup.uplink_ratio:g}:1", fontsize=9)
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("scaling model at the seeds' scale (python -m keras_ddl_tools.scaling_model "
                 "--seeds-plot)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

def add_arguments(parser):
    parser.add_argument("--gpus", help="comma-separated GPU counts (default 8,16,...,1024)")
    parser.add_argument("--model", default="resnet50", choices=MODELS)
    parser.add_argument("--system", default="keras_ddl", choices=sorted(SYSTEMS),
                        help="parameter set for the prediction table (default keras_ddl)")
    parser.add_argument("--gpus-per-node", type=int,
                        help="override the system's GPUs per node (e.g. 4 or 8)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS),
                        help=f"comma-separated, from {','.join(ALGORITHMS)}")
    parser.add_argument("--overlap", type=float,
                        help=f"override the overlap fraction (default {OVERLAP_FRACTION})")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure this machine's shared-memory copy bandwidth (and, under "
                             "mpiexec -n 2, MPI latency) and use them for keras_ddl's "
                             "intra-node link")
    parser.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--fit-json", help="instead: the overlap fraction that reproduces each "
                                           "efficiency of a 'bench fit --cluster 2 --json' file")
    parser.add_argument("--link-rate", default="1gbit",
                        help="with --fit-json: the link rate of that run (default 1gbit)")
    seeds = parser.add_argument_group(
        "the seeds' scale (issue #27 item 6): 64 servers x 4 P100 or 32 servers x 8 H200, "
        "flat / two-level / three-level, refitted on the test cluster")
    seeds.add_argument("--seeds", choices=sorted(SEED_SYSTEMS),
                       help="instead: print the refit and the seeds' tables (Markdown)")
    seeds.add_argument("--seeds-plot", metavar="PATH",
                       help="instead: plot efficiency against link rate for both seeds (PNG)")
    seeds.add_argument("--refit", nargs="*", metavar="JSON",
                       help="print the fit of link efficiency and per-call overhead: to the "
                            "given files, or (no file) to docs/results/{cluster,racks}_*.json, "
                            "falling back to docs/model_data/cluster_observations.json")
    seeds.add_argument("--node-rate", help="per-server link rate each way (tc units: 100gbit; "
                                           "default 100gbit for p100, 400gbit for h200)")
    seeds.add_argument("--nodes-per-rack", type=int,
                       help="servers per rack (default 16 for p100, 8 for h200)")
    seeds.add_argument("--uplink-ratio", type=float, default=4.0,
                       help="oversubscription = servers per rack x server rate / uplink rate "
                            "(default 4, i.e. 4:1; the tables also show 1:1)")
    seeds.add_argument("--batch", type=int,
                       help="per-GPU batch (p100: 32, scaled linearly otherwise; h200: 32 or "
                            "256, the anchors' rows; default 32 / 256)")
    seeds.add_argument("--solve-rate", type=float, default=0.9, metavar="TARGET",
                       help="efficiency the rate tables solve for (default 0.9)")
    seeds.add_argument("--solve-against", choices=("server", "gpu"), default="server",
                       help="the target is relative to one server (default) or absolute")
    seeds.add_argument("--link-efficiency", type=float,
                       help="fraction of the link rates reached (default: the refit's)")
    seeds.add_argument("--update-doc", metavar="MARKDOWN",
                       help="with --seeds: rewrite the <!-- seeds:p100 --> / <!-- seeds:h200 "
                            "--> blocks of this file from the same settings")
    seeds.add_argument("--call-overhead", type=float, metavar="US",
                       help="per-call overhead of the CPU data plane in us (default: the "
                            "refit's); the GPU data plane keeps 50 us")


def _launcher_rank():
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _parse_gpus(text):
    try:
        gpus = [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise SystemExit(f"--gpus: not a list of integers: {text!r}")
    if not gpus or any(g < 1 for g in gpus):
        raise SystemExit(f"--gpus: need positive GPU counts, got {text!r}")
    return gpus


def seed_setups(args, fit):
    """The P100 and H200 SeedSetups from the command line and the refit."""
    if args.uplink_ratio is not None and args.uplink_ratio <= 0:
        raise SystemExit("--uplink-ratio must be > 0")
    if args.nodes_per_rack is not None and args.nodes_per_rack < 1:
        raise SystemExit("--nodes-per-rack must be >= 1")
    if args.link_efficiency is not None and not 0 < args.link_efficiency <= 1:
        raise SystemExit("--link-efficiency must be in (0, 1]")
    try:
        rate = parse_rate(args.node_rate) if args.node_rate else None
    except ValueError as e:
        raise SystemExit(f"--node-rate: {e}")
    common = dict(
        node_rate=rate, nodes_per_rack=args.nodes_per_rack, uplink_ratio=args.uplink_ratio,
        batch=args.batch,
        link_efficiency=(args.link_efficiency if args.link_efficiency is not None
                         else fit.link_efficiency),
        call_overhead=(args.call_overhead * US if args.call_overhead is not None
                       else fit.call_overhead),
        overlap_fraction=(args.overlap if getattr(args, "overlap", None) is not None
                          else OVERLAP_FRACTION))
    if not 0 <= common["overlap_fraction"] <= 1:
        raise SystemExit("--overlap must be between 0 and 1")
    setups = {k: SeedSetup(seeds=k, **common) for k in SEED_SYSTEMS}
    for k, setup in setups.items():
        servers = setup.servers
        if servers % setup.rack_nodes():
            raise SystemExit(f"--nodes-per-rack {setup.rack_nodes()} does not divide the "
                             f"{servers} servers of {k}")
        if k == "h200" and (args.batch or 256) not in (32, 256):
            if args.seeds == "h200" or args.seeds_plot:
                raise SystemExit("--batch: the H200 anchors have 32 and 256 per GPU")
    return setups


def seeds_main(args, out):
    try:
        obs, source = load_observations(args.refit or None)
        fit = refit(obs, source)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"--refit: {e}")
    rows = refit_rows(fit)
    print(format_table(
        f"refit on {source}: link efficiency {fit.link_efficiency:.3f}, per-call overhead "
        f"{fit.call_overhead / US:.0f} us; residuals within +-{100 * fit.spread:.0f}% "
        f"(rms {100 * fit.rms:.0f}%)", list(rows[0]), rows), file=out, flush=True)
    result = {"refit": {"link_efficiency": fit.link_efficiency,
                        "call_overhead_s": fit.call_overhead, "spread": fit.spread,
                        "rms": fit.rms, "source": source, "rows": rows}}
    if not (args.seeds or args.seeds_plot):
        return result
    setups = seed_setups(args, fit)
    if args.seeds:
        setup = setups[args.seeds]
        print(f"\n# {setup.servers} servers x {setup.gpus_per_server} "
              f"{args.seeds.upper()}, racks of {setup.rack_nodes()} servers, "
              f"{setup.rate() / 1e9:g} Gbit/s per server, link efficiency "
              f"{setup.link_efficiency:.3f}, CPU-plane call overhead "
              f"{(setup.call_overhead or 0) / US:.0f} us, batch {setup.per_gpu_batch()}/GPU, "
              f"overlap {setup.overlap_fraction:g}; efficiency in %\n", file=out)
        print(seeds_markdown(setup, args.solve_rate, args.solve_against), file=out, flush=True)
        result["seeds"] = {"table": seeds_table(setup),
                           "rates": seeds_rates(setup, args.solve_rate, args.solve_against)}
    if getattr(args, "update_doc", None):
        with open(args.update_doc) as f:
            text = f.read()
        new = render_seeds_blocks(text, setups, args.solve_rate, args.solve_against)
        with open(args.update_doc, "w") as f:
            f.write(new)
        print(f"# {args.update_doc}: seeds blocks "
              f"{'rewritten' if new != text else 'already up to date'}", file=out)
    if args.seeds_plot:
        if seeds_plot(args.seeds_plot, [setups["p100"], setups["h200"]], args.solve_rate):
            print(f"# plot written to {args.seeds_plot}", file=out)
    return result


def main(args, out=None):
    out = out or sys.stdout
    if (getattr(args, "seeds", None) or getattr(args, "seeds_plot", None)
            or getattr(args, "refit", None) is not None):
        return seeds_main(args, out)
    if getattr(args, "fit_json", None):
        try:
            rate = parse_rate(args.link_rate)
        except ValueError as e:
            raise SystemExit(f"--link-rate: {e}")
        with open(args.fit_json) as f:
            fit = json.load(f)
        try:
            rows = overlap_from_fit(fit, rate, args.model)
        except ValueError as e:
            raise SystemExit(f"--fit-json {args.fit_json}: {e}")
        print(format_table(f"overlap fraction fitted to {args.fit_json} ({args.link_rate} "
                           "links, 2 nodes x 1 rank)",
                           ["overlap", "wire", "against", "measured", "model_f0", "model_f1",
                            "fitted_f"],
                           rows), file=out, flush=True)
        return {"overlap_fit": rows}
    gpus = _parse_gpus(args.gpus) if args.gpus else list(DEFAULT_GPUS)
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    for a in algorithms:
        if a not in ALGORITHMS:
            raise SystemExit(f"--algorithms: unknown {a!r}; choose from {', '.join(ALGORITHMS)}")
    if args.overlap is not None and not 0 <= args.overlap <= 1:
        raise SystemExit("--overlap must be between 0 and 1")

    systems = dict(SYSTEMS)
    measured = None
    rank = _launcher_rank()
    if args.calibrate:
        comm = None
        try:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
            rank = comm.Get_rank()
        except ImportError:
            warnings.warn("mpi4py is not installed: calibrating the copy bandwidth only")
        measured = calibrate(comm=comm)
        systems["keras_ddl"] = calibrated_system(systems["keras_ddl"], measured)
    if args.overlap is not None:
        systems = {k: v.with_(overlap_fraction=args.overlap) for k, v in systems.items()}
    system = systems[args.system]
    if args.gpus_per_node:
        if args.gpus_per_node < 1:
            raise SystemExit("--gpus-per-node must be >= 1")
        system = system.with_(gpus_per_node=args.gpus_per_node)
    bad = [g for g in gpus if g > system.gpus_per_node and g % system.gpus_per_node]
    if bad:
        raise SystemExit(f"--gpus: {bad} do not fill nodes of {system.gpus_per_node} GPUs")
    work = workload(args.model)
    if rank != 0:
        return None

    results = predict(system, work, gpus, algorithms)
    rows = [r.row() for r in results]
    published = compare_published(systems)
    for p, row in zip(PUBLISHED, published):
        row["overlap_needed"] = overlap_needed(p, systems)

    blocks = []
    if measured is not None:
        cal = [{"quantity": "load average (1 min) / CPUs",
                "measured": f"{measured['loadavg_1min']:.1f} / {measured['cpus']}",
                "reference": "a busy machine gives slow links"},
               {"quantity": "numpy copy of 64 MiB, one core (median of 7)",
                "measured": f"{measured['copy_s'] / MS:.2f} ms = {measured['copy_GBps']:.2f} GB/s",
                "reference": "BENCHMARKS.md: ~8 ms"}]
        if "mpi_latency_s" in measured:
            cal += [
                {"quantity": "MPI ping-pong 8 B, half round trip",
                 "measured": f"{measured['mpi_latency_s'] / US:.2f} us", "reference": "-"},
                {"quantity": "MPI ping-pong 16 MiB, bandwidth",
                 "measured": f"{measured['mpi_p2p_GBps']:.2f} GB/s", "reference": "-"},
                {"quantity": f"mpi4py Allreduce 16 MiB, {measured['ranks']} ranks (median of 5)",
                 "measured": f"{measured['mpi_allreduce_s'] / MS:.2f} ms, busbw "
                             f"{measured['mpi_allreduce_busbw_GBps']:.2f} GB/s",
                 "reference": "BENCHMARKS.md: 64 MB in ~50 ms (1.3 GB/s algbw)"},
            ]
        else:
            cal.append({"quantity": "MPI latency", "measured": "not measured (one rank)",
                        "reference": "run under mpiexec -n 2 to measure"})
        link = systems["keras_ddl"].intra
        cal.append({"quantity": "=> keras_ddl intra-node link",
                    "measured": f"alpha {link.alpha / US:.2f} us, {link.bandwidth / GB:.2f} GB/s",
                    "reference": f"copy GB/s / {SHM_TRAFFIC_PER_COPY:g} (memory passes)"})
        blocks.append(format_table("calibration on this machine", ["quantity", "measured",
                                                                   "reference"], cal))
    blocks.append(format_table(f"parameters: {system.description}", ["parameter", "value"],
                               parameter_rows(system)))
    blocks.append(format_table(
        f"scaling model: {system.name}, {work.name} ({work.params / 1e6:.1f} M params, "
        f"{work.nbytes / 1e6:.0f} MB fp32), batch {system.batch_per_gpu}/GPU, "
        f"{system.gpus_per_node} GPUs/node", TABLE_COLUMNS, rows))
    blocks.append(format_table(
        "published vs predicted (efficiency relative to one server, each system with its "
        "own parameters)", PUBLISHED_COLUMNS, published))
    print("\n\n".join(blocks), file=out, flush=True)

    if args.plot:
        if plot(args.plot, system, work, gpus, rows, published, systems):
            print(f"# plot written to {args.plot}", file=out)
    if args.json:
        payload = {"system": system.summary(), "model": {"name": work.name, "params": work.params,
                                                          "bytes": work.nbytes, "macs": work.macs},
                   "overlap_fraction": system.overlap_fraction,
                   "predictions": rows, "published": published,
                   "published_systems": {k: systems[k].summary()
                                         for k in sorted({p.system for p in PUBLISHED})},
                   "calibration": measured}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2, default=str)
    return {"predictions": rows, "published": published, "calibration": measured}


if __name__ == "__main__":
    import argparse
    _parser = argparse.ArgumentParser(
        prog="python -m keras_ddl_tools.scaling_model",
        description="alpha-beta scaling model (the same as python -m keras_ddl.bench model, "
                    "without importing keras_ddl)")
    add_arguments(_parser)
    main(_parser.parse_args())
