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

This package needs only the standard library (numpy and mpi4py for
``--calibrate``, matplotlib for the plot, all imported lazily), so the model
runs anywhere, without TensorFlow or a launcher.

Modules, each importing only those above it:

* ``links``: units, ``Link``, the node and rack arithmetic;
* ``allreduce``: flat and two-level allreduces (ring, halving-doubling,
  multi-ring, hierarchical with a ring or keras_ddl's pairwise cross step);
* ``racks``: the three-level (rack) allreduce;
* ``workloads``: the ResNet gradient lists;
* ``systems``: ``System`` and SYSTEMS;
* ``training``: one step's calls, their cost and the exposed time;
* ``published``: the published points; ``cluster_overlap``: the overlap
  measured on the test cluster; ``calibration``: this machine's links;
* ``anchors``: the measured H200 figures (docs/model_data/h200.md);
  ``cluster_refit``: link efficiency and call overhead refitted on the test
  cluster; ``seeds``: the two reference clusters (64 x 4 P100, 32 x 8 H200)
  and their tables;
* ``tables``, ``plots``, ``doc_blocks`` (the model's figures in
  docs/scaling_model.md): output; ``cli``: the command line
  (``python -m keras_ddl_tools.scaling_model``, ``__main__``).

Every name below is re-exported here, so ``scaling_model.X`` keeps working
for code written against the single-file module. A test that patches a
name must patch it in the module that uses it (e.g. ``cluster_refit``'s
RESULTS_DIR), not here.
"""

from ..rates import parse_rate  # noqa: F401
from .allreduce import (  # noqa: F401
    CROSS_ALGORITHMS, _halving_doubling_steps, _two_factors, flat_halving_doubling, flat_ring,
    halving_doubling_allreduce, hierarchical, multi_ring_allreduce, pairwise_ring_cross,
    ring_allreduce, ring_cross_racks, ring_reduce_scatter)
from .anchors import (  # noqa: F401
    _MODEL_NAMES, ANCHORS_FILE, H200_ANCHORS, _first_number, _md_rows, _two_point_link,
    h200_shm_link, h200_staging, parse_anchors)
from .calibration import _median_time, calibrate, calibrated_system  # noqa: F401
from .cli import (  # noqa: F401
    DEFAULT_GPUS, _launcher_rank, _parse_gpus, add_arguments, main, seed_setups, seeds_main)
from .cluster_overlap import (  # noqa: F401
    half_precision_wire, overlap_from_fit, test_cluster_system)
from .cluster_refit import (  # noqa: F401
    LOCKSTEP_COMMITS, OBSERVATIONS, REFIT_MIN_BYTES, REFIT_PATTERNS, REFIT_SMALL_BYTES,
    RESULTS_DIR, Refit, _fit_bound, _parse_shape, _refit_size, _size_bytes, load_observations,
    observation_bound, observations_from_results, rack_schedule, refit, refit_rows)
from .links import FP32, GB, MS, US, Link, _check, _nodes, _rack_count  # noqa: F401
from .plots import plot, seeds_plot  # noqa: F401
from .published import (  # noqa: F401
    PUBLISHED, PublishedPoint, _closest_fraction, compare_published, overlap_needed)
from .racks import (  # noqa: F401
    LOCKSTEP_MAX_PIECE, LOCKSTEP_PIECES_PER_CALL, RACK_CHUNK_BYTES, RACK_PIECE, SCHEDULES,
    SLICE_MAX_PIECE, SLICE_MIN_PIECE, SLICE_PIECES, Racks, lockstep_pieces,
    rack_allreduce, rack_pieces, slice_pieces, three_level)
from .seeds import (  # noqa: F401
    SEED_ALGORITHMS, SEED_MODELS, SEED_SYSTEMS, SeedSetup, _gbit,
    _systems_algorithms, seed_efficiency, seed_system, seeds_markdown,
    seeds_rates, seeds_table, solve_rate)
from .doc_blocks import BLOCKS, render_blocks  # noqa: F401
from .systems import (  # noqa: F401
    FUSION_POLICIES, LOCAL_SHM_DEFAULT, OVERLAP_FRACTION, P100_RESNET50_STEP, RESNET50_MACS,
    SHM_TRAFFIC_PER_COPY, SYSTEMS, System, shm_link)
from .tables import (  # noqa: F401
    PUBLISHED_COLUMNS, TABLE_COLUMNS, _fmt, format_table, parameter_rows)
from .training import (  # noqa: F401
    ALGORITHMS, StepResult, allreduce_time, buckets, call_time, predict, simulate_step)
from .workloads import (  # noqa: F401
    _RESNET_BLOCKS, MODELS, Tensor, Workload, _resnet_layers, resnet, workload)
