"""Invalid DDL_* environment values: a clear error on every rank, no hang."""

import pytest
from conftest import shared_launch


@pytest.mark.parametrize("name", [
    "DDL_FUSION_THRESHOLD_MB=lots", "DDL_FUSION_THRESHOLD_MB=-1", "DDL_CYCLE_TIME_MS=0",
    "DDL_CYCLE_TIME_MS=1ms", "DDL_ALLREDUCE=ring", "DDL_LOCAL_SIZE=2", "DDL_LOCAL_SIZE=1.5",
    "DDL_STALL_WARNING_S=nan", "DDL_STALL_TIMEOUT_S=-5", "DDL_CACHE_CAPACITY=many",
    "DDL_PEER_TIMEOUT_S=soon", "DDL_SPIN_POLLS=2.5", "DDL_TIMELINE=/nonexistent/dir/trace.json",
    "DDL_ENGINE_PRIORITY=max", "valid_after_fix", "engine_thread_priority"])
def test_bad_value_fails_on_every_rank(name):
    shared_launch(3, "bad_config.py").check(name)
