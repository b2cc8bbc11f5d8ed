"""The C++ core's reduction kernels on their own (no TensorFlow, no MPI):
small C++ programs in tests/core/ compiled against the core's sources."""

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = os.path.join(REPO, "custom_ops")


def build_and_run(program, sources, tmp_path, extra=()):
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        pytest.fail("no C++ compiler: the install step needs one too")
    exe = tmp_path / "check"
    subprocess.run([cxx, "-std=c++17", "-O2", f"-I{OPS}", os.path.join(REPO, "tests", "core",
                    program), *[os.path.join(OPS, s) for s in sources], *extra, "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)


def test_float16_kernels_match_the_scalar_definition(tmp_path):
    proc = build_and_run("half_kernels.cc", ["common/reduce_kernels.cc", "common/types.cc"],
                         tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 mismatches" in proc.stdout, proc.stdout


def test_int16_uint16_and_bool_kernels_match_their_definition(tmp_path):
    proc = build_and_run("small_int_kernels.cc", ["common/reduce_kernels.cc", "common/types.cc"],
                         tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 mismatches" in proc.stdout, proc.stdout


def test_alltoall_algorithm_over_an_in_memory_transport(tmp_path):
    # One thread per rank, 1 to 5 ranks, random uneven splits with zeros;
    # the transport also checks message sizes and the window bound.
    proc = build_and_run("alltoall_threads.cc", ["algorithms/alltoall.cc"], tmp_path,
                         extra=["-pthread"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 mismatches" in proc.stdout, proc.stdout
