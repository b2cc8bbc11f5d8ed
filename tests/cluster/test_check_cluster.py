"""``python -m keras_ddl.check`` on the namespace cluster: 3 nodes, two ranks
each, node links at 1 Gbit/s except node2's at 100 Mbit/s. One launch: every
rank prints its line from its own host, rank 0 the sweep with no wrong
element, and the verdict names node2's link and nothing else, so the check
exits non-zero. Skipped (with the reason) only where the cluster cannot be
made: not root, or no ip / tc."""

import re
import subprocess

import pytest

from keras_ddl_tools.cluster.netns import default_burst, parse_rate

pytestmark = pytest.mark.usefixtures("needs_netns")

SLOW = "100mbit"
_RUN = {}


def slow_down(cluster, node, rate):
    """Caps node ``node``'s (0-based) link both ways at ``rate``, as the
    cluster caps every link, leaving the others as they are."""
    bps = parse_rate(rate)
    shape = ["root", "tbf", "rate", f"{int(bps)}bit", "burst", str(default_burst(bps)),
             "latency", "100ms"]
    subprocess.run(["ip", "netns", "exec", cluster.namespaces[node], "tc", "qdisc", "replace",
                    "dev", "eth0", *shape], check=True)
    subprocess.run(["tc", "qdisc", "replace", "dev", cluster.host_veths[node], *shape],
                   check=True)


def check_run(launcher):
    if "run" not in _RUN:
        from keras_ddl_tools.cluster import NetnsCluster
        with NetnsCluster(3, "1gbit") as cluster:
            slow_down(cluster, 1, SLOW)
            proc, _ = launcher.on_cluster(cluster, 2, "-m", "keras_ddl.check",
                                          "--max-bytes", "1m", timeout=120)
        _RUN["run"] = proc
    return _RUN["run"]


def test_every_rank_prints_its_line_from_its_host(launcher):
    proc = check_run(launcher)
    # Not anchored: mpiexec forwards each rank's output on its own, so a
    # line can land after another rank's unfinished one.
    lines = re.findall(r"DDLCHECK (host=\S+ rank=\d+ local_rank=\d+ gpu=\S+ rack=\S+ "
                       r"rack_source=\S+ shm_free=\d+ probe_port=\d+)", proc.stdout)
    fields = sorted((dict(w.split("=", 1) for w in line.split()) for line in lines),
                    key=lambda f: int(f["rank"]))
    assert [(f["rank"], f["host"], f["local_rank"]) for f in fields] == [
        (str(r), f"node{r // 2 + 1}", str(r % 2)) for r in range(6)], (lines, proc.stdout[-3000:])
    for f in fields:
        assert f["gpu"] == "none" and int(f["shm_free"]) > 0, f
        assert 0 < int(f["probe_port"]) < 65536, f
    # Each rank is a process with a responder of its own: two ranks of a
    # node cannot share a port.
    ports = [(f["host"], f["probe_port"]) for f in fields]
    assert len(set(ports)) == len(ports), ports


def test_the_sweep_has_nccl_tests_columns_and_nothing_wrong(launcher):
    proc = check_run(launcher)
    header = re.search(r"^#\s+size\s+count\s+type\s+redop\s+time_us\s+algbw_GBps\s+busbw_GBps"
                       r"\s+wrong$", proc.stdout, re.M)
    assert header, proc.stdout[-3000:]
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+float32\s+sum\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                      r"\s+(\d+)$", proc.stdout, re.M)
    assert [int(r[0]) for r in rows] == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20], rows
    assert all(r[5] == "0" for r in rows) and all(float(r[2]) > 0 for r in rows), rows


def test_the_verdict_names_the_slow_node_and_nothing_else(launcher):
    proc = check_run(launcher)
    print(proc.stdout)  # the lines, the sweep and the verdict (shown with -rP)
    verdict = re.findall(r"^verdict: (.*)$", proc.stdout, re.M)
    assert len(verdict) == 1 and verdict[0].startswith("slow link: node node2 "), (
        proc.stdout[-3000:] + proc.stderr[-3000:])
    assert proc.returncode == 1, proc.stderr[-3000:]
