"""ddlrun across hosts, on the network-namespace test cluster: ranks on
node2 get ddlrun's environment, output comes back as whole prefixed lines,
and a rank killed on node2 is named by rank and host."""

import re

from launching import output

SCRIPT = "ddlrun_probe.py"
LONG_LINES = 60


def ddlrun(launcher, cluster, options, args, timeout=120):
    from keras_ddl_tools.cluster import MPI_ENV
    return launcher.ddlrun(4, SCRIPT, *args,
                           options=["-H", ",".join(f"{h}:2" for h in cluster.hosts),
                                    "--launcher-exec", cluster.standin, "--iface",
                                    cluster.bridge, *options],
                           env=dict(MPI_ENV, DDLRUN_TEST_VAR="reached-remote"),
                           timeout=timeout, module="keras_ddl_launcher")  # the ddlrun command


def test_remote_ranks_get_the_environment_and_print_whole_prefixed_lines(launcher):
    cluster = launcher.cluster(2)
    proc = ddlrun(launcher, cluster, ["-l"], ["report", str(LONG_LINES)])
    assert proc.returncode == 0, output(proc)
    reports = {}
    long_lines = {rank: 0 for rank in range(4)}
    for line in proc.stdout.splitlines():
        m = re.fullmatch(r"\[(\d)\] (.*)", line)
        assert m, f"line without a rank prefix or split mid-line: {line[:200]!r}"
        rank, text = int(m.group(1)), m.group(2)
        if text.startswith("RANK "):
            reports[rank] = text
        else:
            assert text == "abcdefgh"[rank] * 5000, \
                f"rank {rank}'s line is cut or mixed: {text[:80]!r}...{text[-80:]!r}"
            long_lines[rank] += 1
    hosts = {rank: "node1" if rank < 2 else "node2" for rank in range(4)}
    assert reports == {r: f"RANK {r} host={hosts[r]} var=reached-remote sum=6" for r in range(4)}, \
        output(proc)
    assert long_lines == {r: LONG_LINES for r in range(4)}
    for rank in range(4):
        assert f"[{rank}] rank {rank} done" in proc.stderr.splitlines(), output(proc)


def test_rank_killed_on_the_second_host_is_named_with_its_host(launcher):
    cluster = launcher.cluster(2)
    proc = ddlrun(launcher, cluster, ["--no-prefix-output"], ["kill"])
    assert proc.returncode != 0, output(proc)
    killed = re.search(r"^RANK 3 killed at ([\d.]+)$", proc.stdout, re.MULTILINE)
    assert killed, output(proc)
    assert proc.ended - float(killed.group(1)) < 30, "ddlrun outlived the killed rank by 30 s"
    assert re.search(r"^ddlrun: the job failed \(exit code \d+\); rank 3 on node2 ended first "
                     r"\(killed by SIGKILL\)", proc.stderr, re.MULTILINE), output(proc)
