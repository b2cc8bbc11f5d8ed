"""What ddl.init() does to a process before any collective, on every rank:
one GPU per local rank (with TensorFlow's GPU list faked: no GPU here), and
HOROVOD_* settings mapped to DDL_* or named in a warning on rank 0 only.
Run by tests/mpi/test_init_environment_mpi.py under mpiexec -n 2 with
HOROVOD_* variables and a Slurm step's set by the test; reports DDLCASE lines like harness.py.
"""

import os
import time
import traceback
import warnings

from fake_gpus import FakeGpus
from harness import report

from keras_ddl.common import basics, launch_env

FAKE_GPU_COUNT = 4
# The checks main() reports (tests/mpi/test_init_environment_mpi.py runs each).
CASES = ("bad_horovod_value_is_named", "horovod_settings_mapped",
         "horovod_warning_on_rank_zero_only", "launcher_count_agrees_with_world",
         "one_gpu_per_local_rank")


def main():
    fake = FakeGpus(FAKE_GPU_COUNT).install()
    checks = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # HOROVOD_CYCLE_TIME=0 becomes DDL_CYCLE_TIME_MS=0, which the engine
        # refuses: the error must name the variable the user wrote.
        try:
            basics.init()
            first_error = None
        except ValueError as e:
            first_error = str(e)
        os.environ["DDL_CYCLE_TIME_MS"] = "3"
        basics.init()
    rank, local_rank = basics.rank(), basics.local_rank()
    messages = [str(w.message) for w in caught if "HOROVOD_" in str(w.message)]

    def bad_horovod_value_is_named():
        assert first_error is not None, "init() accepted HOROVOD_CYCLE_TIME=0"
        assert "HOROVOD_CYCLE_TIME" in first_error and "DDL_CYCLE_TIME_MS" in first_error, \
            first_error

    def horovod_settings_mapped():
        assert os.environ.get("DDL_FUSION_THRESHOLD_MB") == "32.0", \
            os.environ.get("DDL_FUSION_THRESHOLD_MB")
        assert os.environ.get("DDL_ALLREDUCE") == "hierarchical", os.environ.get("DDL_ALLREDUCE")

    def horovod_warning_on_rank_zero_only():
        if rank != 0:
            assert messages == [], messages
            return
        assert len(messages) == 1, messages
        text = messages[0]
        for name in ("HOROVOD_GPU_OPERATIONS", "HOROVOD_LOG_LEVEL",
                     "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_FUSION_THRESHOLD"):
            assert name in text, (name, text)
        # The launch sets DDL_STALL_TIMEOUT_S too: the DDL_* value wins.
        assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: ignored: DDL_STALL_TIMEOUT_S" in text, text
        assert "HOROVOD_GPU_OPERATIONS: ignored" in text, text

    def launcher_count_agrees_with_world():
        # init() passed with the launcher check on: the count it believed
        # is Hydra's, the same as the world's.
        claim = launch_env.launcher_claim()
        assert claim is not None and claim[:2] == ("PMI_SIZE", 2), claim
        assert basics.size() == 2, basics.size()

    def one_gpu_per_local_rank():
        expected = f"/physical_device:GPU:{local_rank % FAKE_GPU_COUNT}"
        assert [d.name for d in fake.visible] == [expected], (local_rank, fake.visible)
        assert fake.growth == {expected: True}, fake.growth

    for check in (bad_horovod_value_is_named, horovod_settings_mapped,
                  horovod_warning_on_rank_zero_only, one_gpu_per_local_rank,
                  launcher_count_agrees_with_world):
        start = time.time()
        try:
            check()
            report(check.__name__, rank, True, seconds=time.time() - start)
        except Exception:
            report(check.__name__, rank, False, traceback.format_exc(), time.time() - start)
    basics.shutdown()


if __name__ == "__main__":
    main()
