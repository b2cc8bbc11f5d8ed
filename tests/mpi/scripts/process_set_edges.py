"""add_process_set's edge cases under mpiexec (2 and 3 ranks, run by
tests/mpi/test_process_set_edges_mpi.py with DDL_PEER_TIMEOUT_S=5): two threads
calling at once, lists that differ, a rank that never calls. The cases run
in this order in one launch; the last leaves the ranks unable to agree on
new sets (every later call is refused), as it must."""

import threading
import time

import numpy as np
import tensorflow as tf
from harness import case, run_cases

import keras_ddl as ddl

rank = ddl.rank()
size = ddl.size()
TIMEOUT_S = 5.0  # DDL_PEER_TIMEOUT_S of the launch


def expect_value_error(call, words, what):
    try:
        call()
    except ValueError as e:
        for w in words:
            assert w in str(e), f"{what}: {w!r} not in {e}"
        return str(e)
    raise AssertionError(f"{what}: no error")


def set_sum(ps):
    """Every member's rank + 1, summed over the set."""
    got = ddl.allreduce(tf.constant([float(rank + 1)]), op=ddl.Sum, process_set=ps).numpy()
    assert got[0] == sum(r + 1 for r in ps.ranks), (ps, got)


@case
def two_threads_add_sets_at_once():
    """Two threads of every rank call add_process_set at the same moment:
    the calls are serialised, each thread gets its own set, and both sets
    reduce correctly."""
    lists = [list(range(size)), [0, size - 1]]
    results, errors = [None, None], [None, None]
    start = threading.Barrier(2)

    def add(i):
        try:
            start.wait()
            # The same list in both threads: whichever goes first on a rank,
            # the ranks agree on every call.
            results[i] = ddl.add_process_set(list(lists[0]))
        except Exception as e:  # reported below
            errors[i] = e

    threads = [threading.Thread(target=add, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=4 * TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a call from two threads hangs"
    assert errors == [None, None], errors
    ids = sorted(ps.process_set_id for ps in results)
    assert ids[0] != ids[1], f"both threads got set {ids[0]}"
    for ps in sorted(results, key=lambda p: p.process_set_id):
        set_sum(ps)


@case
def differing_lists_error_on_every_rank():
    """Rank 0 passes another list than the others: every rank raises a
    ValueError naming what each rank passed; the ranks stay in step, so the
    next call with equal lists works."""
    mine = [0] if rank == 0 else list(range(size))
    message = expect_value_error(lambda: ddl.add_process_set(mine),
                                 ["differ", "rank 0 passed [0]", f"rank {rank}"],
                                 "differing lists")
    others = "rank 1" if size == 2 else "ranks [1, 2]"
    assert f"{others} passed {list(range(size))}" in message, message
    ps = ddl.add_process_set(list(range(size)))
    set_sum(ps)


@case
def a_rank_that_skips_the_call_errors_everywhere_within_the_timeout():
    """The last rank does not call add_process_set (it is busy for longer
    than DDL_PEER_TIMEOUT_S): every other rank raises a ValueError naming
    it and the set's ranks within the timeout. When it calls late it gets
    the same verdict at once. Every later add_process_set is refused on
    every rank with a clear message; world collectives still run."""
    late = size - 1
    wanted = list(range(size))
    if rank == late:
        time.sleep(TIMEOUT_S + 2)  # something else
        start = time.time()
        expect_value_error(lambda: ddl.add_process_set(wanted),
                           [f"rank {late} did not call add_process_set", f"rank {rank}"],
                           "the late caller")
        assert time.time() - start < TIMEOUT_S, f"the late call took {time.time() - start:.1f} s"
    else:
        start = time.time()
        expect_value_error(lambda: ddl.add_process_set(wanted),
                           [f"rank {late} did not call add_process_set", str(wanted),
                            "DDL_PEER_TIMEOUT_S", f"rank {rank}"],
                           "a rank skipped the call")
        took = time.time() - start
        assert took < TIMEOUT_S + 3, f"the error took {took:.1f} s"
    expect_value_error(lambda: ddl.add_process_set(wanted),
                       ["refused", "earlier add_process_set failed", "restart", f"rank {rank}"],
                       "a call after the failure")
    got = ddl.allreduce(tf.constant([1.0]), op=ddl.Sum, name="after.sets").numpy()
    np.testing.assert_array_equal(got, [float(size)])


if __name__ == "__main__":
    run_cases()
