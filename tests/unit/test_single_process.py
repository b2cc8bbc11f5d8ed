"""keras_ddl in this very process, with no launcher: a world of size 1."""

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_ddl as ddl
from keras_ddl.common import basics
from keras_ddl.tensorflow import library as op_library


def test_world_of_one_without_launcher():
    ddl.init()
    ddl.init()  # idempotent
    assert ddl.is_initialized()
    assert (ddl.rank(), ddl.size(), ddl.local_rank(), ddl.local_size(),
            ddl.cross_rank(), ddl.cross_size()) == (0, 1, 0, 1, 0, 1)
    assert ddl.allreduce_algorithm() == "flat"


def test_collectives_are_identities_at_size_one():
    x = tf.constant(np.arange(7, dtype=np.float32))
    for op in (ddl.Sum, ddl.Average, ddl.Min, ddl.Max, ddl.Product):
        np.testing.assert_array_equal(ddl.allreduce(x, op=op).numpy(), x.numpy())
    np.testing.assert_array_equal(ddl.allgather(x).numpy(), x.numpy())
    np.testing.assert_array_equal(ddl.broadcast(x, 0).numpy(), x.numpy())
    np.testing.assert_array_equal(ddl.reducescatter(tf.reshape(x, [7, 1])).numpy(),
                                  x.numpy().reshape(7, 1))
    a, b = ddl.grouped_allreduce([x, tf.ones([2], tf.int64)], op=ddl.Sum)
    assert b.dtype == tf.int64 and b.numpy().tolist() == [1, 1]
    np.testing.assert_array_equal(ddl.alltoall(x).numpy(), x.numpy())
    out, received = ddl.alltoall(x, splits=[7])
    np.testing.assert_array_equal(out.numpy(), x.numpy())
    assert received.dtype == tf.int32 and received.numpy().tolist() == [7]
    flags = tf.constant([True, False])
    for op in (ddl.Sum, ddl.Min, ddl.Max, ddl.Product):
        assert ddl.allreduce(flags, op=op).numpy().tolist() == [True, False]
    ddl.barrier()


def test_shutdown_then_use_raises_then_reinit():
    ddl.shutdown()
    assert not ddl.is_initialized()
    with pytest.raises(tf.errors.FailedPreconditionError, match="not initialized"):
        op_library.op_library().ddl_allreduce(tf.ones([1]), tf.constant("after.shutdown"), reduce_op=0)
    ddl.init()
    assert ddl.allreduce(tf.ones([2]), op=ddl.Sum).numpy().tolist() == [1.0, 1.0]


def test_op_library_for_another_tensorflow_says_how_to_rebuild(monkeypatch):
    monkeypatch.setattr(op_library, "_lib", None)  # the cached library
    monkeypatch.setattr(basics, "build_info", lambda: {"tensorflow": "2.15.0"})
    with pytest.raises(ImportError) as info:
        op_library.op_library()
    msg = str(info.value)
    assert "built for TensorFlow 2.15.0" in msg and tf.__version__ in msg
    assert "pip install --no-build-isolation" in msg


def test_settings_in_force_are_the_configured_ones_without_autotune():
    # In a process of its own: the engine reads DDL_* once, at init.
    script = "import keras_ddl as ddl; print('IN_FORCE', sorted(ddl.settings_in_force().items()))"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", DDL_AUTOTUNE="0",
               DDL_FUSION_THRESHOLD_MB="16", DDL_CYCLE_TIME_MS="2.5")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IN_FORCE [('cycle_time_ms', 2.5), ('fusion_threshold_mb', 16.0)]" in proc.stdout, \
        proc.stdout


def _bits(values, dtype):
    return np.asarray(values, dtype=dtype).view(np.uint16)


@pytest.mark.parametrize("dtype, to16, from16", [
    (np.float16, "ddl_float_to_half", "ddl_half_to_float"),
    (tf.bfloat16.as_numpy_dtype, "ddl_float_to_bfloat16", "ddl_bfloat16_to_float")])
def test_16_bit_conversions_round_like_numpy(dtype, to16, from16):
    lib = basics.core_library()
    rng = np.random.default_rng(0)
    specials = [0.0, -0.0, 1.0, 65504.0, 65520.0, 1e-8, 6e-8, 5.96e-8, 2.98e-8, 1e5, -1e-5,
                np.inf, -np.inf, 3.4e38, 1.00048828125, 1.0009765625, 1.00146484375]
    values = np.concatenate([np.float32(specials),
                             rng.standard_normal(2000).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 2000)])
    got = np.array([getattr(lib, to16)(float(v)) for v in values], dtype=np.uint16)
    with np.errstate(over="ignore"):
        expected = _bits(values.astype(dtype), dtype)
        reference = values.astype(dtype).astype(np.float32)
    mismatch = np.nonzero(got != expected)[0]
    assert mismatch.size == 0, [(values[i], got[i], expected[i]) for i in mismatch[:5]]
    assert getattr(lib, to16)(float("nan")) & 0x7fff > (0x7c00 if dtype == np.float16 else 0x7f80)
    back = np.array([getattr(lib, from16)(int(b)) for b in expected], dtype=np.float32)
    np.testing.assert_array_equal(back, reference)


def test_the_repository_root_imports_the_installed_package():
    # What `python -c "import keras_ddl"` from the repository root does after
    # `pip install .`: the current directory comes first on sys.path, and in
    # the src layout it holds no keras_ddl, so the built, installed package
    # is the one imported (no warning, no path rewriting).
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert not os.path.exists(os.path.join(repo, "keras_ddl"))
    script = ("import warnings; warnings.simplefilter('error')\n"
              "import keras_ddl, keras_ddl.common.basics as b\n"
              "keras_ddl.init()\n"
              "print('PACKAGE', keras_ddl.__path__[0])\n"
              "print('SUM', keras_ddl.allreduce([1.0, 2.0], op=keras_ddl.Sum).numpy().tolist())\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    proc = subprocess.run([sys.executable, "-c", script], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    package = proc.stdout.split("PACKAGE ", 1)[1].split()[0]
    assert os.path.realpath(package) == os.path.realpath(os.path.dirname(ddl.__file__))
    assert os.path.exists(os.path.join(package, "build_info.json")), package
    assert "SUM [1.0, 2.0]" in proc.stdout, proc.stdout


@pytest.mark.parametrize("call, owner", [
    (lambda bad: ddl.broadcast(tf.ones([2]), root_rank=bad), "keras_ddl"),
    (lambda bad: ddl.broadcast_variables([tf.Variable(1.0)], root_rank=bad), "keras_ddl"),
    (lambda bad: ddl.callbacks.BroadcastGlobalVariablesCallback(root_rank=bad),
     "BroadcastGlobalVariablesCallback"),
    (lambda bad: ddl.callbacks.BackupAndRestore("backups", root_rank=bad), "BackupAndRestore"),
])
@pytest.mark.parametrize("bad", ["0", 1.0, True])
def test_a_root_rank_that_is_not_an_int_is_the_same_error_everywhere(call, owner, bad):
    with pytest.raises(TypeError, match=rf"{owner} root_rank must be an int, got .* on rank 0"):
        call(bad)


def test_autograph_calls_the_public_ops_as_they_are():
    # Converting them inside a user's tf.function gains nothing and re-reads
    # their source at every trace; _private_api.skip_autograph marks them
    # (the public do_not_convert, with a per-call wrapper, is its fallback).
    from tensorflow.python.autograph.impl import api as autograph_api
    for fn in (ddl.allreduce, ddl.grouped_allreduce, ddl.allgather, ddl.broadcast,
               ddl.reducescatter, ddl.barrier, ddl.grouped_allgather,
               ddl.grouped_reducescatter, ddl.broadcast_):
        assert autograph_api.is_autograph_artifact(fn), fn.__name__

    @tf.function
    def step(x):
        return ddl.allreduce(x, op=ddl.Sum, name="autograph.check") * 2

    np.testing.assert_array_equal(step(tf.ones([3])).numpy(), [2.0, 2.0, 2.0])


# The C boundary (custom_ops/bindings/c_api.cc). Run in a child process:
# without the checks, a null buffer or a capacity of 0 wrote before the
# buffer or into address 0 and ended the process. The child runs with
# tests/core/c_boundary_faults.cc preloaded, which makes chosen MPI calls
# fail and chosen allocations throw (each line marked "fault").
C_BOUNDARY = r"""
import ctypes
from keras_ddl.common import basics
lib = basics.core_library()
faults = ctypes.CDLL(None)  # the preloaded fault library
lib.ddl_mpi_library_version.argtypes = [ctypes.c_char_p, ctypes.c_int]
lib.ddl_topology.argtypes = [ctypes.c_char_p, ctypes.c_int]
lib.ddl_last_error.restype = ctypes.c_char_p
def error():
    return lib.ddl_last_error().decode()
n = lib.ddl_mpi_library_version(None, 0)
buf = ctypes.create_string_buffer(8)
short = lib.ddl_mpi_library_version(buf, 8)
print("VERSION", n, short, len(buf.value))
faults.ddl_fault_allocations(1)
print("VERSION_NOMEM", lib.ddl_mpi_library_version(buf, 8), error())  # fault
faults.ddl_fault_mpi(b"MPI_Comm_dup")
print("INIT_DUP", lib.ddl_init(), error())  # fault
faults.ddl_fault_mpi(b"MPI_Comm_set_errhandler")
print("INIT_ERRHANDLER", lib.ddl_init(), error())  # fault
assert lib.ddl_init() == 0, error()
print("TOPOLOGY", lib.ddl_topology(None, 100), lib.ddl_topology(None, 0))
faults.ddl_fault_allocations(1)
print("TOPOLOGY_NOMEM", lib.ddl_topology(None, 100), error())  # fault
set_id = ctypes.c_int(-7)
code = lib.ddl_add_process_set((ctypes.c_int * 1)(0), -1, ctypes.byref(set_id))
print("ADD", code, set_id.value, error())
print("SHUTDOWN", lib.ddl_shutdown())
"""


def fault_library(tmp_path):
    """tests/core/c_boundary_faults.cc built against the MPI the core uses."""
    mpi = basics.build_info().get("mpi", "")
    if not mpi.startswith("mpich wheel at "):
        pytest.skip(f"the fault library is built against the mpich wheel; this core uses {mpi}")
    prefix = mpi[len("mpich wheel at "):]
    out = tmp_path / "c_boundary_faults.so"
    source = os.path.join(os.path.dirname(os.path.dirname(__file__)), "core",
                          "c_boundary_faults.cc")
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{prefix}/include",
                    source, "-o", str(out), "-ldl"], check=True, capture_output=True, text=True)
    return str(out)


def test_c_entry_points_check_sizes_and_counts(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", LD_PRELOAD=fault_library(tmp_path))
    proc = subprocess.run([sys.executable, "-c", C_BOUNDARY], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split()[0]: line.split(maxsplit=1)[1] for line in proc.stdout.splitlines()
             if line.split() and line.split()[0].isupper()}
    n, short, written = map(int, lines["VERSION"].split())
    # No buffer: the length only; 8 bytes: 7 characters and the NUL.
    assert n > 8 and short == n and written == 7, lines
    # An exception inside an entry point (here std::bad_alloc) is -2 and
    # the error text, never an exception into the C caller (which aborts).
    for name in ("VERSION_NOMEM", "TOPOLOGY_NOMEM"):
        code, message = lines[name].split(maxsplit=1)
        assert code == "-2" and message == "keras_ddl internal error: std::bad_alloc", lines
    # MPI return codes at set-up: an error (4, Internal) naming the call,
    # and the next init works.
    code, message = lines["INIT_DUP"].split(maxsplit=1)
    assert code == "4" and message.startswith("MPI_Comm_dup of MPI_COMM_WORLD failed: "), lines
    code, message = lines["INIT_ERRHANDLER"].split(maxsplit=1)
    assert code == "4" and message.startswith(
        "setting up the world's communicator failed: MPI_Comm_set_errhandler: "), lines
    full, empty = map(int, lines["TOPOLOGY"].split())
    assert full > 0 and full == empty, lines
    code, set_id, message = lines["ADD"].split(maxsplit=2)
    # n < 0 is the caller's mistake (1, InvalidArgument), named; no set made.
    assert code == "1" and set_id == "-7" and "n = -1 ranks" in message, lines
    assert lines["SHUTDOWN"] == "0", lines


def test_shutdown_raises_the_cores_error(monkeypatch):
    class FailingCore:
        @staticmethod
        def ddl_shutdown():
            return 4

        @staticmethod
        def ddl_last_error():
            return b"the engine thread could not be joined"

    monkeypatch.setattr(basics, "_core", FailingCore())
    with pytest.raises(RuntimeError, match=r"keras_ddl.shutdown\(\) failed: the engine thread "
                                           r"could not be joined"):
        ddl.shutdown()
