"""The allreduce benchmark's ``wrong`` column, in one process (no launch):
``count_wrong`` compares the result chunk by chunk against the expected sum
without materialising it, and must still see every element, the last partial
chunk's included; the inputs it is built from are the sums' summands."""

import tracemalloc

import numpy as np
import pytest

from keras_ddl_tools.bench import allreduce as bench


def _reference_wrong(result, ranks):
    """The check as it was: the whole expected array, built in int64."""
    count = result.size
    expected = ((np.arange(count, dtype=np.int64) % 7) * ranks
                + ranks * (ranks - 1) // 2).astype(np.float32)
    return int(np.count_nonzero(result.reshape(-1) != expected))


def test_inputs_and_expected_are_the_int64_formulas_in_float32():
    for count in (0, 1, 6, 7, 8, 100, 7 * 13 + 3):
        for rank in (0, 1, 5):
            old = (np.arange(count, dtype=np.int64) % 7 + rank).astype(np.float32)
            new = bench._inputs(count, rank)
            assert new.dtype == np.float32 and new.shape == (count,)
            np.testing.assert_array_equal(new, old)
    # the expected value is the sum of every rank's input
    count, ranks = 7 * 11 + 4, 5
    total = sum(bench._inputs(count, r) for r in range(ranks))
    np.testing.assert_array_equal(bench._expected(count, ranks), total)


@pytest.mark.parametrize("count", [1, 6, 14, 15, 7 * 9, 7 * 9 + 5])
def test_count_wrong_sees_every_element_the_last_chunk_included(count):
    ranks, chunk = 3, 14  # several chunks, the last one partial unless count % 14 == 0
    good = sum(bench._inputs(count, r) for r in range(ranks))
    assert bench.count_wrong(good, ranks, chunk=chunk) == 0
    for index in sorted({0, count // 2, max(count - chunk, 0), count - 1}):
        bad = good.copy()
        bad[index] += 1
        assert bench.count_wrong(bad, ranks, chunk=chunk) == 1, index
    # the very last element alone, in the last (partial) chunk
    bad = good.copy()
    bad[-1] = np.nan  # NaN != anything: counted
    assert bench.count_wrong(bad, ranks, chunk=chunk) == 1


def test_count_wrong_matches_the_whole_array_check():
    rng = np.random.default_rng(27)
    ranks, count = 8, 7 * 1000 + 3
    good = bench._expected(count, ranks)
    for _ in range(20):
        bad = good.copy()
        hit = rng.choice(count, size=rng.integers(1, 50), replace=False)
        bad[hit] += rng.choice([-1.0, 0.5, 7.0], size=hit.size).astype(np.float32)
        for chunk in (7, 70, 7 << 17):
            assert bench.count_wrong(bad, ranks, chunk=chunk) == _reference_wrong(bad, ranks) \
                == hit.size
    # any shape: the gradient list's tensors are 1- to 4-dimensional
    shaped = bench._expected(2 * 3 * 5 * 7, ranks).reshape(2, 3, 5, 7).copy()
    shaped[1, 2, 4, 6] = -1
    assert bench.count_wrong(shaped, ranks, chunk=21) == 1


def test_count_wrong_wants_chunks_of_whole_periods():
    with pytest.raises(ValueError, match="multiple of 7"):
        bench.count_wrong(bench._expected(20, 2), 2, chunk=10)
    with pytest.raises(ValueError):
        bench.count_wrong(bench._expected(20, 2), 2, chunk=0)


def test_count_wrong_allocates_a_chunk_not_the_result():
    ranks, count = 2, 8 << 20  # 32 MB of float32
    result = bench._expected(count, ranks)
    tracemalloc.start()
    try:
        assert bench.count_wrong(result, ranks) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < result.nbytes // 4, peak


def test_input_tensor_is_the_numpy_inputs_and_its_buffer_is_checked_in_place():
    tf = pytest.importorskip("tensorflow")
    for count in (7 * 5, 7 * 5 + 2):
        x = bench._input_tensor(count, 3)
        assert x.dtype == tf.float32 and tuple(x.shape) == (count,)
        np.testing.assert_array_equal(x.numpy(), bench._inputs(count, 3))
    # a two-rank sum as a tensor: right, then wrong in its last element only
    count = 7 * 4 + 5
    total = bench._input_tensor(count, 0) + bench._input_tensor(count, 1)
    assert bench.count_wrong(total, 2, chunk=7) == 0
    bad = tf.tensor_scatter_nd_update(total, [[count - 1]], [100.0])
    assert bench.count_wrong(bad, 2, chunk=7) == 1
