"""The Horovod-parity ops and the Horovod front door under mpiexec with 2
and 3 ranks (one launch per rank count runs every case of
tests/mpi/scripts/horovod_cases.py), and a Horovod-style Keras script that must
train exactly like the same script on keras_ddl's own API.

The 2-rank launch takes the default path (one machine: shared memory);
the 3-rank one the flat path over MPI, where float16 crosses a wire
(tests/mpi/test_compressed_average_mpi.py reads its compression cases)."""

import os
import sys

import numpy as np
import pytest
from launching import TESTS_DIR, case_names

SCRIPT = "horovod_cases.py"
ENV = {2: {}, 3: {"DDL_ALLREDUCE": "flat"}}
EXAMPLES = os.path.join(os.path.dirname(TESTS_DIR), "examples")


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("name", case_names(SCRIPT))
def test_case(launcher, nprocs, name):
    launcher.cases(nprocs, SCRIPT, env=ENV[nprocs]).check(name)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_launch_exits_cleanly(launcher, nprocs):
    launcher.cases(nprocs, SCRIPT, env=ENV[nprocs]).check_clean_exit()


def test_horovod_style_script_trains_like_keras_ddl_api(launcher, tmp_path):
    """The same training, written against Horovod's Keras API (only the
    import changed) and against keras_ddl's, gives the same final weights."""
    finals = {}
    for script in ("horovod_keras_mnist_style.py", "ddl_keras_mnist_style.py"):
        out = tmp_path / script.split("_")[0]
        proc = launcher.mpi(2, os.path.join(EXAMPLES, script), str(out), timeout=300)
        assert proc.returncode == 0, f"{script}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        checkpoints = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint"))
        assert checkpoints == ["checkpoint-1.weights.h5", "checkpoint-2.weights.h5"], checkpoints
        assert proc.stdout.count("Epoch 2/2") == 1, "only rank 0 should print progress"
        with np.load(out / "final_weights.npz") as f:
            finals[script] = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
    horovod, ddl = finals.values()
    assert len(horovod) == len(ddl) > 0
    for i, (a, b) in enumerate(zip(horovod, ddl)):
        assert np.array_equal(a, b), f"weight {i} differs: max |diff| {np.abs(a - b).max()}"
    # Training moved the weights (the comparison is not between two untouched models).
    assert not np.array_equal(horovod[0], np.load(tmp_path / "horovod" / "initial_weights.npz")
                              ["arr_0"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
