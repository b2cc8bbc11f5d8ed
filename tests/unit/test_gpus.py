"""keras_ddl.gpus on one process, with TensorFlow's GPU list faked at
tf.config (tests/mpi/scripts/fake_gpus.py): which GPU each local rank gets, the
opt-out, a bad DDL_PIN_GPU, and TensorFlow started before init()."""

import os
import sys
import warnings

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mpi",
                                "scripts"))
from fake_gpus import FakeGpus  # noqa: E402

from keras_ddl.common import gpus  # noqa: E402


@pytest.fixture
def fake():
    made = []

    def install(count, runtime_started=False):
        made.append(FakeGpus(count, runtime_started).install())
        return made[-1]

    yield install
    for f in reversed(made):
        f.uninstall()


@pytest.mark.parametrize("local_rank,expected", [(0, 0), (1, 1), (3, 3)])
def test_local_rank_gets_gpu_local_rank_mod_count(fake, local_rank, expected):
    f = fake(4)
    chosen = gpus.pin_gpu_to_local_rank(local_rank, 4, environ={})
    name = f"/physical_device:GPU:{expected}"
    assert chosen.name == name
    assert [d.name for d in f.visible] == [name]
    assert f.growth == {name: True}


def test_more_ranks_than_gpus_warns(fake):
    f = fake(2)
    with pytest.warns(RuntimeWarning, match="3 ranks on this server share 2"):
        gpus.pin_gpu_to_local_rank(2, 3, environ={})
    assert [d.name for d in f.visible] == ["/physical_device:GPU:0"]


def test_one_visible_gpu_from_cuda_visible_devices_is_used_by_every_local_rank(fake):
    # With CUDA_VISIBLE_DEVICES naming one GPU per rank, TF lists just that
    # one; keras_ddl keeps it and never rewrites CUDA_VISIBLE_DEVICES.
    f = fake(1)
    environ = {"CUDA_VISIBLE_DEVICES": "5"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one GPU per rank: nothing to warn about
        chosen = gpus.pin_gpu_to_local_rank(3, 1, environ=environ)
    assert chosen.name == "/physical_device:GPU:0"
    assert environ == {"CUDA_VISIBLE_DEVICES": "5"}
    assert f.growth == {"/physical_device:GPU:0": True}


@pytest.mark.parametrize("value", ["0", "false", "OFF"])
def test_opt_out_leaves_devices_alone(fake, value):
    f = fake(4)
    assert gpus.pin_gpu_to_local_rank(1, 4, environ={"DDL_PIN_GPU": value}) is None
    assert len(f.visible) == 4 and f.growth == {}


def test_bad_pin_value_names_the_variable(fake):
    fake(4)
    with pytest.raises(ValueError, match="DDL_PIN_GPU='maybe' is not a boolean"):
        gpus.pin_gpu_to_local_rank(0, 1, environ={"DDL_PIN_GPU": "maybe"})


def test_no_gpu_is_a_no_op(fake):
    f = fake(0)
    assert gpus.pin_gpu_to_local_rank(1, 2, environ={}) is None
    assert f.visible == [] and f.growth == {}


def test_runtime_started_with_all_gpus_is_an_error_not_gpu_zero(fake):
    fake(4, runtime_started=True)
    with pytest.raises(gpus.GpuPinningError) as e:
        gpus.pin_gpu_to_local_rank(1, 4, environ={})
    message = str(e.value)
    assert "GPU:1" in message and "before creating any tensor" in message
    assert "DDL_PIN_GPU=0" in message


def test_runtime_started_with_only_this_gpu_keeps_it_and_warns(fake):
    f = fake(1, runtime_started=True)
    with pytest.warns(RuntimeWarning, match="memory growth"):
        chosen = gpus.pin_gpu_to_local_rank(0, 1, environ={})
    assert chosen.name == "/physical_device:GPU:0" and f.growth == {}
