"""Systems: one set of parameters per machine / software stack (SYSTEMS), the
overlap fraction they share, and the shared-memory link of keras_ddl's
intra-node path."""

import dataclasses
from dataclasses import dataclass

from .links import GB, MS, US, Link
from .workloads import resnet

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

# keras_ddl's shared-memory link by default: an assumed single-core copy of
# 64 MB in 8 ms (8.4 GB/s, a quiet server core's order of magnitude) and a
# latency of the order of a microsecond, as MPICH's shared memory has.
# ``--calibrate`` measures both on the machine it runs on.
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
        description="keras_ddl as built on GPU servers: CPU kernels (GPU tensors "
                    "staged through host memory), shared memory in a node, a pairwise "
                    "reduce-scatter and ring all-gather over MPI across nodes on 100 Gb/s "
                    "EDR InfiniBand",
        gpus_per_node=8,
        intra=LOCAL_SHM_DEFAULT,
        inter=Link(alpha=3 * US, bandwidth=12 * GB),
        staging=Link(alpha=10 * US, bandwidth=10 * GB),    # PCIe 3.0 x16 per GPU
        staging_in_node=True,
        resnet50_step=P100_RESNET50_STEP,
        batch_per_gpu=32,
        algorithm="hierarchical", cross="pairwise",
        fusion="cycle", fusion_bytes=128 * 2**20, cycle=1 * MS, negotiation=True,
        sources=("assumed: a single-core copy of 64 MB in 8 ms (--calibrate measures it)",
                 "docs/knobs.md: DDL_FUSION_THRESHOLD_MB=128, DDL_CYCLE_TIME_MS=1; "
                 "docs/architecture.md: shared memory in a node, pairwise reduce-scatter "
                 "and ring all-gather across nodes")),
}


# A bandwidth-optimal 2-rank allreduce through shared memory moves about
# 224 MB of memory traffic per rank for 64 MB of data (an estimate: the
# copies in and out and the reduction's reads and writes), while the
# ring formula counts 64 MB sent; a plain copy moves 128 MB of traffic for
# 64 MB. So one byte "sent" by the shared-memory allreduce costs 224/128 of
# a copied byte.
SHM_TRAFFIC_PER_COPY = 224 / 128


def shm_link(copy_bandwidth, alpha):
    """The intra-node link of keras_ddl's shared-memory path, from the
    measured single-core copy bandwidth and small-message latency."""
    return Link(alpha=alpha, bandwidth=copy_bandwidth / SHM_TRAFFIC_PER_COPY)


# The keras_ddl system's default intra link is the same formula applied to
# the assumed copy above (64 MB in 8 ms), so --calibrate only
# replaces measured numbers, never the method.
SYSTEMS["keras_ddl"] = SYSTEMS["keras_ddl"].with_(
    intra=shm_link(64 * 2**20 / (8 * MS), LOCAL_SHM_DEFAULT.alpha))
