"""The first real cluster's edges on the namespace test cluster, in one
launch (tests/mpi/scripts/container_limits.py): 2 racks x 1 node x 4 ranks, every
node with a /dev/shm of 64 MiB of its own, as a container has unless told
otherwise; node links 1 Gbit/s, uplinks 1 Gbit/s, then 10 Mbit/s.

- A small /dev/shm is one clear error on every rank at init, naming
  /dev/shm, the bytes needed and free, and the fixes; never a signal.
  Within DDL_SHM_ARENA_MB the same job then allreduces 64 MB right.
- A slow but moving transfer is not a dead peer: an allgather whose one
  round over the 10 Mbit/s uplinks takes longer than DDL_PEER_TIMEOUT_S
  (3 s) completes, with the one warning that it is slow; the uplinks'
  counters show its bytes crossed them.

Skipped (with the reason) only where namespaces cannot be made.
"""

import re
import time

import pytest
from launching import LiveLaunch

pytestmark = pytest.mark.usefixtures("needs_netns")

SCRIPT = "container_limits.py"
PEER_TIMEOUT_S = 3
RANKS = 8
_RUN = {}


def limits_run(launcher, tmp_path_factory):
    if "run" in _RUN:
        return _RUN["run"]
    from keras_ddl_tools.cluster import NetnsCluster
    go = tmp_path_factory.mktemp("limits") / "go"
    with NetnsCluster(1, "1gbit", racks=2, uplink="1gbit", shm="64m") as cluster:
        argv = launcher.cluster_argv(cluster, 4, SCRIPT, "small_shm", "slow_allgather")
        env = launcher.cluster_env({"DDL_PEER_TIMEOUT_S": str(PEER_TIMEOUT_S),
                                    "DDL_TEST_GO_FILE": str(go)})
        start = cluster.uplink_bytes()
        run = LiveLaunch(argv, env)
        ready = None
        deadline = time.time() + 400
        while time.time() < deadline and run.proc.poll() is None:
            if ready is None and run.count("SLOW_PHASE_READY"):
                ready = cluster.uplink_bytes()
                cluster.set_uplink("10mbit")
                go.write_text("go")
            time.sleep(0.2)
        code = run.wait(timeout=deadline - time.time())
        end = cluster.uplink_bytes()
    _RUN["run"] = (code, run.stdout(), run.stderr(), start, ready, end)
    return _RUN["run"]


def results(out, phase):
    return {int(r): rest for r, rest in re.findall(rf"^RESULT {phase} (\d+) (.*)$", out,
                                                   re.MULTILINE)}


def test_small_dev_shm_is_one_clear_error_on_every_rank(launcher, tmp_path_factory):
    code, out, err, start, ready, _ = limits_run(launcher, tmp_path_factory)
    errors = {int(r): m for r, m in re.findall(r"^SHM_ERROR (\d+) (.*)$", out, re.MULTILINE)}
    assert sorted(errors) == list(range(RANKS)), out[-3000:] + err[-3000:]
    for rank, message in errors.items():
        for part in ("keras_ddl.init() failed: /dev/shm is too small on host node",
                     "the staging area of the node's 4 ranks (4 slots of 4096 KiB each) needs "
                     "64.0 MiB", "free of 64.0 MiB", "docker run --shm-size=",
                     "emptyDir with `medium: Memory`", "DDL_SHM_ARENA_MB"):
            assert part in message, (rank, message)
    # Never a signal: no bus error, no rank killed.
    assert "Bus error" not in out + err and "BAD TERMINATION" not in out + err, err[-3000:]
    done = results(out, "small_shm")
    assert sorted(done) == list(range(RANKS)) and all(v.startswith("ok") for v in done.values()), \
        done
    # The 64 MB allreduce went over the uplinks (2(R-1)/R of it each way).
    assert ready is not None, out[-3000:]
    for (o0, i0), (o1, i1) in zip(start, ready):
        assert o1 - o0 >= 60e6 and i1 - i0 >= 60e6, (start, ready)


def test_slow_but_moving_allgather_completes(launcher, tmp_path_factory):
    code, out, err, _, ready, end = limits_run(launcher, tmp_path_factory)
    done = results(out, "slow_allgather")
    assert sorted(done) == list(range(RANKS)), out[-3000:] + err[-3000:]
    failed = {r: v for r, v in done.items() if not v.startswith("ok")}
    assert not failed, failed
    seconds = [float(v.split()[1]) for v in done.values()]
    # It outlasted the peer timeout: nothing completed for that long, and
    # the judge kept the wait going, saying so once.
    assert max(seconds) > PEER_TIMEOUT_S, seconds
    assert "[keras_ddl] warning: slow transfer: nothing completed for" in err, err[-3000:]
    assert "lost contact" not in err, err[-3000:]
    assert code == 0, err[-3000:]
    # Rack 1's 4 MB reached rack 2 and back over the slow uplinks.
    for (o0, i0), (o1, i1) in zip(ready, end):
        assert o1 - o0 >= 4e6 and i1 - i0 >= 4e6, (ready, end)
