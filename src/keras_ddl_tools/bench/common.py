"""Timing and table helpers shared by the benchmarks."""

import statistics
import time

from mpi4py import MPI

COMM = MPI.COMM_WORLD


def timed(fn, reps, warmup=2):
    """Median over reps of the slowest rank's time for fn(), in seconds.

    Ranks start each repetition together (barrier) and the slowest rank
    defines the time, as a collective is done only when every rank is.
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        COMM.Barrier()
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        samples.append(COMM.allreduce(elapsed, op=MPI.MAX))
    return statistics.median(samples)


def human_bytes(n):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n}B"


def print_table(title, columns, rows, out=None):
    """Prints rows (dicts) under a header, nccl-tests style, on rank 0."""
    if COMM.Get_rank() != 0:
        return
    widths = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) if rows else len(c)
              for c in columns}
    lines = [f"# {title}", "  ".join(c.rjust(widths[c]) for c in columns)]
    lines += ["  ".join(_fmt(r[c]).rjust(widths[c]) for c in columns) for r in rows]
    print("\n".join(lines), file=out, flush=True)


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def dump_json(path, payload):
    """Rank 0 writes payload with the run's date, commit, command and machine."""
    if COMM.Get_rank() == 0 and path:
        from keras_ddl_tools.results import write_json
        payload = dict(payload, ranks_in_launch=COMM.Get_size())
        write_json(path, payload)
