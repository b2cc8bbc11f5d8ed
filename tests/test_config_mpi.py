"""Invalid DDL_* environment values: a clear error on every rank, no hang."""

import pytest


@pytest.mark.parametrize("name", [
    "DDL_FUSION_THRESHOLD_MB=lots", "DDL_FUSION_THRESHOLD_MB=-1", "DDL_CYCLE_TIME_MS=0",
    "DDL_CYCLE_TIME_MS=1ms", "DDL_ALLREDUCE=ring", "DDL_LOCAL_SIZE=2", "DDL_LOCAL_SIZE=1.5",
    "DDL_STALL_WARNING_S=nan", "DDL_STALL_TIMEOUT_S=-5", "DDL_CACHE_CAPACITY=many",
    "DDL_PEER_TIMEOUT_S=soon", "DDL_SPIN_POLLS=2.5", "DDL_TIMELINE=/nonexistent/dir/trace.json",
    "DDL_ENGINE_PRIORITY=max", "DDL_UPLINK_COMPRESSION=gzip", "DDL_PRINT_TOPOLOGY=yes",
    "DDL_JOB_SECRET=0123456789abcdef0123456789abcdeZ", "valid_after_fix", "engine_thread_priority"])
def test_bad_value_fails_on_every_rank(launcher, name):
    launcher.cases(3, "bad_config.py").check(name)


DIFFERING = ["differs:DDL_FUSION_THRESHOLD_MB", "differs:DDL_CACHE_CAPACITY",
             "differs:DDL_ALLREDUCE", "differs:DDL_LOCAL_SIZE", "differs:DDL_SHM_POOL_MB",
             "differs:DDL_AUTOTUNE", "differs:DDL_AUTOTUNE_STEPS", "differs:DDL_AUTOTUNE_CYCLES",
             "differs:DDL_UPLINK_COMPRESSION",
             "per_rank_settings_may_differ"]


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", DIFFERING)
def test_settings_that_differ_between_ranks_fail_on_every_rank(launcher, name, ranks):
    """Only the last rank's value differs (rank 1 of 2, rank 2 of 3): every
    rank fails at init naming the setting and each rank's value."""
    launcher.cases(ranks, "differing_config.py").check(name)
