"""Calibration on this machine: numpy copy bandwidth and, under mpiexec,
MPI latency, bandwidth and an mpi4py Allreduce (numpy and mpi4py imported
lazily), and keras_ddl's intra-node link from them."""

import os
import time

from .links import GB
from .systems import shm_link

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
