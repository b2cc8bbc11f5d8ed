"""The command line of ``python -m keras_ddl.bench model`` and ``python -m
keras_ddl_tools.scaling_model``: the prediction table, the overlap fit of a
``bench fit --cluster 2`` result, the refit on the test cluster and the
tables of the two reference clusters (64 servers x 4 P100, 32 x 8 H200)."""

import json
import os
import sys
import warnings

from ..rates import parse_rate
from .calibration import calibrate, calibrated_system
from .cluster_overlap import overlap_from_fit
from .cluster_refit import load_observations, refit, refit_rows
from .links import GB, MS, US
from .plots import plot, seeds_plot
from .published import PUBLISHED, compare_published, overlap_needed
from .doc_blocks import render_blocks
from .seeds import SEED_SYSTEMS, SeedSetup, seeds_markdown, seeds_rates, seeds_table
from .systems import OVERLAP_FRACTION, SHM_TRAFFIC_PER_COPY, SYSTEMS
from .tables import PUBLISHED_COLUMNS, TABLE_COLUMNS, format_table, parameter_rows
from .training import ALGORITHMS, predict
from .workloads import MODELS, workload

DEFAULT_GPUS = [8, 16, 32, 64, 128, 256, 512, 1024]


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
        "two reference clusters, PowerAI DDL's 64 servers x 4 P100 and 32 servers x 8 H200: "
        "flat / two-level / three-level allreduce, refitted on the test cluster")
    seeds.add_argument("--reference", "--seeds", dest="seeds", choices=sorted(SEED_SYSTEMS),
                       help="instead: print the refit and that cluster's tables (Markdown)")
    seeds.add_argument("--reference-plot", "--seeds-plot", dest="seeds_plot", metavar="PATH",
                       help="instead: plot efficiency against link rate for both reference "
                            "clusters (PNG)")
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
                            "256, the measured H200 rows; default 32 / 256)")
    seeds.add_argument("--solve-rate", type=float, default=0.9, metavar="TARGET",
                       help="efficiency the rate tables solve for (default 0.9)")
    seeds.add_argument("--solve-against", choices=("server", "gpu"), default="server",
                       help="the target is relative to one server (default) or absolute")
    seeds.add_argument("--link-efficiency", type=float,
                       help="fraction of the link rates reached (default: the refit's)")
    seeds.add_argument("--update-doc", metavar="MARKDOWN",
                       help="rewrite the <!-- model:NAME --> blocks of this file (the "
                            "model's tables in docs/scaling_model.md) from the same settings")
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
                raise SystemExit("--batch: the H200 measurements have 32 and 256 per GPU")
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
    if not (args.seeds or args.seeds_plot or getattr(args, "update_doc", None)):
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
        try:
            new = render_blocks(text, setups, fit, args.solve_rate, args.solve_against)
        except KeyError as e:
            raise SystemExit(f"--update-doc {args.update_doc}: {e.args[0]}")
        with open(args.update_doc, "w") as f:
            f.write(new)
        print(f"# {args.update_doc}: model blocks "
              f"{'rewritten' if new != text else 'already up to date'}", file=out)
    if args.seeds_plot:
        if seeds_plot(args.seeds_plot, [setups["p100"], setups["h200"]], args.solve_rate):
            print(f"# plot written to {args.seeds_plot}", file=out)
    return result


def main(args, out=None):
    out = out or sys.stdout
    if (getattr(args, "seeds", None) or getattr(args, "seeds_plot", None)
            or getattr(args, "update_doc", None) or getattr(args, "refit", None) is not None):
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
                "reference": "the default link assumes 8.4 GB/s (64 MB in 8 ms)"}]
        if "mpi_latency_s" in measured:
            cal += [
                {"quantity": "MPI ping-pong 8 B, half round trip",
                 "measured": f"{measured['mpi_latency_s'] / US:.2f} us", "reference": "-"},
                {"quantity": "MPI ping-pong 16 MiB, bandwidth",
                 "measured": f"{measured['mpi_p2p_GBps']:.2f} GB/s", "reference": "-"},
                {"quantity": f"mpi4py Allreduce 16 MiB, {measured['ranks']} ranks (median of 5)",
                 "measured": f"{measured['mpi_allreduce_s'] / MS:.2f} ms, busbw "
                             f"{measured['mpi_allreduce_busbw_GBps']:.2f} GB/s",
                 "reference": "reported, not used by the model"},
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
