"""keras_ddl.horovod_env on one process: conversions, precedence of DDL_*,
bad values named (the 2-rank behaviour is in test_init_environment_mpi.py)."""

import warnings

import pytest

from keras_ddl.common import horovod_env


def test_twins_are_converted():
    env = {"HOROVOD_FUSION_THRESHOLD": str(64 << 20), "HOROVOD_CYCLE_TIME": "2.5",
           "HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_CACHE_CAPACITY": "0",
           "HOROVOD_STALL_CHECK_TIME_SECONDS": "120",
           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600",
           "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
    notes = dict(horovod_env.apply(env))
    assert env["DDL_FUSION_THRESHOLD_MB"] == "64.0"
    assert env["DDL_CYCLE_TIME_MS"] == "2.5"
    assert env["DDL_TIMELINE"] == "/tmp/t.json"
    assert env["DDL_CACHE_CAPACITY"] == "0"
    assert env["DDL_STALL_WARNING_S"] == "120"
    assert env["DDL_STALL_TIMEOUT_S"] == "600"
    assert env["DDL_ALLREDUCE"] == "hierarchical"
    assert notes["HOROVOD_CYCLE_TIME"] == "mapped to DDL_CYCLE_TIME_MS=2.5"
    assert horovod_env.mapped_from("DDL_CYCLE_TIME_MS", notes.items()) == "HOROVOD_CYCLE_TIME"


def test_ddl_value_wins_and_unknown_names_are_noted():
    env = {"HOROVOD_CYCLE_TIME": "9", "DDL_CYCLE_TIME_MS": "1",
           "HOROVOD_HIERARCHICAL_ALLREDUCE": "0", "HOROVOD_ELASTIC": "1"}
    notes = dict(horovod_env.apply(env))
    assert env["DDL_CYCLE_TIME_MS"] == "1" and "DDL_ALLREDUCE" not in env
    assert notes["HOROVOD_CYCLE_TIME"].startswith("ignored: DDL_CYCLE_TIME_MS='1' is set")
    assert notes["HOROVOD_ELASTIC"] == "ignored: keras_ddl has no equivalent"
    assert "nothing to set" in notes["HOROVOD_HIERARCHICAL_ALLREDUCE"]


@pytest.mark.parametrize("name,value", [("HOROVOD_FUSION_THRESHOLD", "64MB"),
                                        ("HOROVOD_CACHE_CAPACITY", "-1"),
                                        ("HOROVOD_HIERARCHICAL_ALLREDUCE", "maybe")])
def test_bad_value_names_the_horovod_variable(name, value):
    with pytest.raises(ValueError, match=name):
        horovod_env.apply({name: value})


def test_warning_only_on_rank_zero():
    notes = [("HOROVOD_ELASTIC", "ignored: keras_ddl has no equivalent")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        horovod_env.warn(notes, rank=1)
        horovod_env.warn([], rank=0)
    assert caught == []
    with pytest.warns(RuntimeWarning, match="HOROVOD_ELASTIC: ignored"):
        horovod_env.warn(notes, rank=0)
