"""``python -m keras_ddl.check [--max-bytes N] [--link-bytes N]``: every
rank prints its line, rank 0 the allreduce sweep and the verdict; exits 1
when the verdict finds a problem (docs/your_cluster.md, "First contact")."""

import argparse
import os
import socket
import sys
import time

from .verdict import RankRecord, format_rows, problems

# A pair's link is timed over up to LINK_REPS exchanges, fewer once they
# took LINK_ENOUGH_S (a slow link's one exchange is already long enough).
LINK_REPS = 5
LINK_ENOUGH_S = 0.2
SWEEP_COLUMNS = ["size", "count", "type", "redop", "time_us", "algbw_GBps", "busbw_GBps",
                 "wrong"]


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t[-1:] in units else int(t)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 4096, 64k or 16m")


def build_parser():
    p = argparse.ArgumentParser(prog="python -m keras_ddl.check", description=__doc__)
    p.add_argument("--min-bytes", type=parse_size, default=4 << 10,
                   help="smallest allreduce of the sweep (default 4k)")
    p.add_argument("--max-bytes", type=parse_size, default=16 << 20,
                   help="largest allreduce of the sweep, sizes x4 (default 16m)")
    p.add_argument("--reps", type=int, default=5, help="timed calls per size (default 5)")
    p.add_argument("--link-bytes", type=parse_size, default=4 << 20,
                   help="bytes each node pair exchanges to time its link (default 4m)")
    return p


def shm_free(path="/dev/shm"):
    try:
        s = os.statvfs(path)
    except OSError:
        return 0
    return s.f_bavail * s.f_frsize


def visible_gpu():
    import tensorflow as tf
    gpus = tf.config.get_visible_devices("GPU")
    return ",".join(g.name.replace("/physical_device:", "") for g in gpus) or "none"


def own_rack(ddl, rank):
    """(rack, source): the rack the ranks agreed on at init; without one,
    the rank's own SLURM_TOPOLOGY_ADDR, which init did not use."""
    topo = ddl.topology()
    rack = topo["racks"][topo["rack_of_rank"][rank]] if topo["racks"] else ""
    if rack:
        return rack, topo["source"]
    addr = os.environ.get("SLURM_TOPOLOGY_ADDR", "")
    if "." in addr:
        return addr.split(".")[-2], "SLURM_TOPOLOGY_ADDR, not used by init"
    if topo["source"] == "probe" and topo["probe_verdict"]:
        return "", f"probe:{topo['probe_verdict'].replace(' ', '_')}"
    return "", topo["source"] or "none"


def node_leaders(ddl):
    """The lowest rank of every node, in node order."""
    leaders = {}
    for r, node in enumerate(ddl.topology()["node_of_rank"]):
        leaders.setdefault(node, r)
    return [leaders[n] for n in sorted(leaders)]


def link_rates(comm, leaders, hosts, nbytes):
    """{host: best rate in bytes/s over its pairs}. The node leaders'
    pairs exchange ``nbytes`` each way one pair at a time (no pair shares a
    link with another), after a small warm-up exchange; a pair's rate is
    its bytes over the slower end's time, the best of up to LINK_REPS
    exchanges (one on a link slow enough to take LINK_ENOUGH_S): a single
    exchange on a fast link is a few milliseconds, which one descheduled
    process can double."""
    import numpy as np
    rank = comm.Get_rank()
    send = np.ones(nbytes, np.uint8)
    recv = np.empty(nbytes, np.uint8)
    best = {hosts[r]: 0.0 for r in leaders}
    for i, a in enumerate(leaders):
        for b in leaders[i + 1:]:
            peer = b if rank == a else a if rank == b else None
            if peer is not None:
                comm.Sendrecv(send[:4096], peer, 7, recv[:4096], peer, 7)
            fastest, spent = float("inf"), 0.0
            for _ in range(LINK_REPS):
                elapsed = 0.0
                if peer is not None:
                    start = time.perf_counter()
                    comm.Sendrecv(send, peer, 8, recv, peer, 8)
                    elapsed = time.perf_counter() - start
                # Every rank takes part, so every rank agrees when to stop.
                elapsed = comm.allreduce(elapsed, op=_max())
                fastest, spent = min(fastest, elapsed), spent + elapsed
                if spent >= LINK_ENOUGH_S:
                    break
            rate = nbytes / fastest if fastest > 0 else 0.0
            for r in (a, b):
                best[hosts[r]] = max(best[hosts[r]], rate)
    return best


def _max():
    from mpi4py import MPI
    return MPI.MAX


def sweep(ddl, args, comm):
    """nccl-tests-style rows of the default allreduce (sum of float32)."""
    import numpy as np
    import tensorflow as tf
    n, rank = ddl.size(), ddl.rank()
    rows, nbytes = [], args.min_bytes
    while nbytes <= args.max_bytes:
        count = max(1, nbytes // 4)
        x = tf.constant(np.full(count, rank + 1, np.float32))
        out = ddl.allreduce(x, op=ddl.Sum, name=f"check_{count}")  # warm-up
        samples = []
        for i in range(args.reps):
            comm.Barrier()
            start = time.perf_counter()
            out = ddl.allreduce(x, op=ddl.Sum, name=f"check_{count}")
            _ = out.numpy()
            samples.append(comm.allreduce(time.perf_counter() - start, op=_max()))
        t = sorted(samples)[len(samples) // 2]
        wrong = int(np.count_nonzero(out.numpy() != n * (n + 1) / 2))
        wrong = comm.allreduce(wrong)
        algbw = count * 4 / t / 1e9
        rows.append({"size": count * 4, "count": count, "type": "float32", "redop": "sum",
                     "time_us": t * 1e6, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * 2 * (n - 1) / n, "wrong": wrong})
        nbytes *= 4
    return rows


def parse_args(argv=None):
    """The options, with the ones that cannot run refused by name (on
    every rank: each parses its own command line, before MPI starts)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"argument --reps: {args.reps}: expected 1 or more")
    if not 4 <= args.min_bytes <= args.max_bytes:
        parser.error(f"arguments --min-bytes {args.min_bytes} and --max-bytes {args.max_bytes}: "
                     f"expected 4 <= min <= max")
    if args.link_bytes < 4096:
        parser.error(f"argument --link-bytes: {args.link_bytes}: expected 4096 or more")
    return args


def main(argv=None):
    args = parse_args(argv)
    free_before = shm_free()  # before init commits the staging area
    import keras_ddl as ddl
    from keras_ddl.common.basics import probe_port
    ddl.init()
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = ddl.rank()
    rack, source = own_rack(ddl, rank)
    record = RankRecord(host=socket.gethostname(), rank=rank, local_rank=ddl.local_rank(),
                        local_size=ddl.local_size(), gpu=visible_gpu(), rack=rack,
                        rack_source=source, shm_free=free_before, probe_port=probe_port(),
                        settings={k: v for k, v in os.environ.items() if k.startswith("DDL_")})
    print(f"DDLCHECK host={record.host} rank={rank} local_rank={record.local_rank} "
          f"gpu={record.gpu} rack={record.rack or 'none'} rack_source={record.rack_source} "
          f"shm_free={record.shm_free} probe_port={record.probe_port}", flush=True)
    records = [RankRecord(**r) for r in ddl.allgather_object(vars(record))]
    hosts = [r.host for r in records]
    rows = sweep(ddl, args, comm)
    rates = link_rates(comm, node_leaders(ddl), hosts, args.link_bytes)
    found = problems(records, rates)
    if rank == 0:
        lines = [f"# keras_ddl check: {ddl.size()} ranks on {len(set(hosts))} hosts, "
                 f"allreduce {ddl.allreduce_algorithm()}"]
        lines += format_rows(SWEEP_COLUMNS, rows)
        if len(rates) > 1:
            lines.append("# node links (best pair, MB/s): " + ", ".join(
                f"{h} {r / 1e6:.1f}" for h, r in rates.items()))
        else:
            lines.append("# node links: one node, no link to time")
        if any(r["wrong"] for r in rows):
            found.append("wrong results: the allreduce sweep returned wrong values")
        lines += [f"verdict: {p}" for p in found] or ["verdict: ok"]
        print("\n".join(lines), flush=True)
    failed = comm.bcast(bool(found) or any(r["wrong"] for r in rows), root=0)
    ddl.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
