"""ddlrun --min-np/--max-np/--host-discovery-script: bad combinations are
clear errors; which hosts a failed attempt blames (from the rules' own
inputs); the host pool's joins, leaves and rejoins; and real launches on
fake hosts (a stand-in for ssh runs every host's ranks on this machine and
refuses hosts named lost*): a host whose rank died is left out and the job
finishes on the rest, with the time lost measured; a host the diagnoses
name unreachable is left out, a host whose launch fails is left out, a
host the discovery script lists again rejoins; too few slots end the job.
Fast: mpi4py only (the TensorFlow job that loses a node for good is in
test_elastic_cluster.py)."""

import importlib.util
import os
import re
import subprocess
import sys
import types

import pytest
from launching import output

from keras_ddl_launcher import ddlrun, elastic
from keras_ddl_launcher.deathwatch import LOST, Death
from keras_ddl_launcher.hosts import DiscoveryScript, launch_check

PROBE = "elastic_probe.py"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_SSH = """#!/bin/sh
# ssh [options] HOST COMMAND...: runs COMMAND on this machine; hosts named
# lost* cannot be reached.
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2;;
    -*) shift;;
    *) break;;
  esac
done
host=$1; shift
case "$host" in
  lost*) echo "ssh: connect to host $host port 22: No route to host" >&2; exit 255;;
esac
# As a real ssh's remote command, it inherits no descriptor of the caller:
# a proxy that kept mpiexec's listening socket would wait on it forever
# once mpiexec is gone (its own connection queued, never accepted).
exec "{python}" -c 'import os, sys; os.closerange(3, 65536); os.execvp("sh", ["sh", "-c", sys.argv[1]])' "$*"
""".replace("{python}", sys.executable)


def script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


# -- flags ---------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["--min-np", "2"], "--min-np, --max-np and --host-discovery-script apply with "
                        "--max-restarts N (N >= 1)"),
    (["--max-restarts", "1", "--max-np", "6"], "--min-np and --max-np need the hosts to choose "
                                               "from: -H, --hostfile or --host-discovery-script"),
    (["--max-restarts", "1", "-H", "a:2,b:2", "--min-np", "5"], "--min-np 5 exceeds -np 4"),
    (["--max-restarts", "1", "-H", "a:2,b:2", "--min-np", "0"], "--min-np must be >= 1, got 0"),
    (["--max-restarts", "1", "-H", "a:2,b:2", "--max-np", "3"], "--max-np 3 is below -np 4"),
    (["--max-restarts", "1", "-H", "a:2,b:2", "--min-np", "2", "--launcher", "srun"],
     "apply with --launcher mpiexec only"),
    (["--max-restarts", "1", "-H", "a:2,b:2", "--min-np", "2", "--local-size", "2"],
     "--local-size applies to a fixed world size"),
    (["-H", "a:2,b:2", "--slots-per-host", "2"],
     "--slots-per-host applies with --host-discovery-script only"),
    (["--max-restarts", "1", "--host-discovery-script", "/nonexistent/hosts.sh"],
     "--host-discovery-script /nonexistent/hosts.sh: not an executable file"),
    (["--max-restarts", "1", "-H", "a:4", "--host-discovery-script", "true"],
     "not allowed with"),
    (["-H", "a:2,a:2"], "-H: host 'a' is listed twice"),
])
def test_bad_elastic_options_are_clear_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ddlrun.main(["-np", "4", *argv, "python"])
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("body, words", [
    ("echo 'no cloud here' >&2; exit 3", "failed with exit code 3: no cloud here"),
    ("echo node1:x", "'node1:x' is not host or host:slots"),
    ("echo node1:2", "-np 4 exceeds the 2 slots listed by the discovery script"),
])
def test_a_failing_or_wrong_discovery_script_is_a_clear_error(body, words, tmp_path, capsys):
    hosts = script(tmp_path / "hosts.sh", f"#!/bin/sh\n{body}\n")
    with pytest.raises(SystemExit) as exit_info:
        ddlrun.main(["-np", "4", "--max-restarts", "1", "--host-discovery-script", hosts,
                     "python"])
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def test_dry_run_prints_the_first_attempt_on_the_discovered_hosts(tmp_path, capsys):
    hosts = script(tmp_path / "hosts.sh",
                   "#!/bin/sh\necho a:2@r1\necho b@r1\necho c:2@r2\n")
    common = ["--max-restarts", "2", "--host-discovery-script", hosts, "--slots-per-host", "2",
              "--dry-run"]
    assert ddlrun.main(["-np", "4", *common, "true"]) == 0
    out = capsys.readouterr().out
    assert "DDL_TOPOLOGY=r1=a,b " in out and " -n 4 -hosts a:2,b:2 " in out, out
    assert ddlrun.main(["-np", "4", "--max-np", "5", *common, "true"]) == 0
    out = capsys.readouterr().out
    assert "DDL_TOPOLOGY=r1=a,b;r2=c " in out and " -n 5 -hosts a:2,b:2,c:1 " in out, out


# -- blame, from its inputs ----------------------------------------------

def fault_line(rank, host, lost):
    """A diagnosis in the engine's format naming `lost` {rank: (host, state)}."""
    entries = "; ".join(f"rank {r} on {h} {state}: whatever it means"
                        for r, (h, state) in lost.items())
    return (f"[keras_ddl] at unix time 1.000: rank {rank} on {host} lost contact in negotiation "
            f"(no progress for 5 s). Unreachable: rank(s) [{', '.join(map(str, lost))}]: "
            f"{entries}. keras_ddl ends this process now (exit code 70)")


def attempt(hosts, deaths=(), faults=None, hello=None, launcher_text="", timed_out=False):
    """A failed attempt as find_blame sees it: every placed rank said hello
    unless ``hello`` says otherwise; ``deaths`` [(rank, how)] in order."""
    placed = elastic.placement(hosts)
    ranks = {r: "thishost" for r in placed} if hello is None else hello
    deaths = [Death(1.0 + i, r, "x", how) for i, (r, how) in enumerate(deaths)]
    watch = types.SimpleNamespace(ranks=ranks, deaths=deaths, fault_lines=faults or {},
                                  launcher_text=launcher_text.encode())
    failure = next((d for d in deaths if d.how != "exit code 0"), None)
    return types.SimpleNamespace(watch=watch, failure=failure, start_timed_out=timed_out)


HOSTS3 = [("a", 1), ("b", 1), ("c", 1)]
CUT = "unreachable"


@pytest.mark.parametrize("case, kwargs, blamed", [
    ("c silent, a and b name it unreachable",
     dict(deaths=[(0, "exit code 70"), (1, "exit code 70")],
          faults={0: fault_line(0, "a", {2: ("c", CUT)}), 1: fault_line(1, "b", {2: ("c", CUT)})}),
     ["c"]),
    ("c heard and naming a and b: cut off from two hosts",
     dict(deaths=[(0, "exit code 70"), (1, "exit code 70"), (2, "exit code 70")],
          faults={0: fault_line(0, "a", {2: ("c", CUT)}), 1: fault_line(1, "b", {2: ("c", CUT)}),
                  2: fault_line(2, "c", {0: ("a", CUT), 1: ("b", CUT)})}),
     ["c"]),
    ("one diagnosis does not name c",
     dict(deaths=[(0, "exit code 70")],
          faults={0: fault_line(0, "a", {2: ("c", CUT)}), 1: fault_line(1, "b", {0: ("a", CUT)})}),
     []),
    ("c's rank stopped, not unreachable",
     dict(deaths=[(0, "exit code 70")], faults={0: fault_line(0, "a", {2: ("c", "stopped")}),
                                                1: fault_line(1, "b", {2: ("c", "stopped")})}),
     []),
    ("a rank's own error exit", dict(deaths=[(1, "exit code 1"), (0, "killed by SIGKILL")]), []),
    ("a rank stopped by SIGTERM", dict(deaths=[(2, "killed by SIGTERM")]), []),
    ("a rank killed by SIGKILL first", dict(deaths=[(1, "killed by SIGKILL"),
                                                     (0, "killed by SIGKILL")]), ["b"]),
    ("a rank that vanished first", dict(deaths=[(2, LOST)]), ["c"]),
    ("no hello from c, and the launcher names it",
     dict(hello={0: "h", 1: "h"}, launcher_text="ssh: connect to host c port 22: refused\n"),
     ["c"]),
    ("no hello from c, not named, not timed out, its launch not checked",
     dict(hello={0: "h", 1: "h"}), []),
    ("no hello from c, start timed out", dict(hello={0: "h", 1: "h"}, timed_out=True), ["c"]),
])
def test_which_hosts_a_failed_attempt_blames(case, kwargs, blamed):
    found = elastic.find_blame(HOSTS3, attempt(HOSTS3, **kwargs))
    assert [h for h, _ in found] == blamed, (case, found)


def test_a_host_without_ranks_is_blamed_if_its_launch_check_fails():
    failed = attempt(HOSTS3, hello={0: "h"})  # neither b's nor c's rank started
    checked = []

    def can_launch(host):
        checked.append(host)
        return "'ssh c true' failed (exit code 255): no route" if host == "c" else None

    found = elastic.find_blame(HOSTS3, failed, can_launch=can_launch)
    assert checked == ["b", "c"]
    assert found == [("c", "the launch failed there: its rank 2 never started, and 'ssh c "
                           "true' failed (exit code 255): no route")]


def test_the_launch_check_runs_the_launcher_program(tmp_path):
    ssh = script(tmp_path / "fake-ssh", FAKE_SSH)
    assert launch_check(ssh, "fakea") is None
    assert launch_check(ssh, "lostb") == (f"'{ssh} lostb true' failed (exit code 255): ssh: "
                                          "connect to host lostb port 22: No route to host")


def test_two_hosts_that_name_each_other_blame_neither():
    hosts = [("a", 2), ("b", 2)]
    faults = {r: fault_line(r, "a", {2: ("b", CUT), 3: ("b", CUT)}) for r in (0, 1)}
    faults.update({r: fault_line(r, "b", {0: ("a", CUT), 1: ("a", CUT)}) for r in (2, 3)})
    deaths = [(r, "exit code 70") for r in range(4)]
    assert elastic.find_blame(hosts, attempt(hosts, deaths=deaths, faults=faults)) == []


def test_the_pool_follows_the_discovery_script(tmp_path):
    listing = tmp_path / "listing"
    hosts = script(tmp_path / "hosts.sh", f"#!/bin/sh\ncat {listing}\n")
    listing.write_text("a:2\nb:2\nc:2\n")
    discovery = DiscoveryScript(hosts)
    pool = elastic.HostPool(*discovery.run(), min_np=2, max_np=4, discovery=discovery)
    assert pool.fill(pool.size()) == [("a", 2), ("b", 2)]
    pool.leave_out("b", "its rank died")
    assert pool.fill(pool.size()) == [("a", 2), ("c", 2)]  # c was the spare
    listing.write_text("a:2\nb:2\nd:1\n")  # c leaves, d joins, b still listed
    assert pool.rediscover() == [("c", "leaves", "the discovery script no longer lists it"),
                                 ("d", "joins", "the discovery script lists it")]
    assert pool.fill(pool.size()) == [("a", 2), ("d", 1)]
    listing.write_text("a:2\nd:1\n")  # b unlisted while left out...
    assert pool.rediscover() == []
    listing.write_text("d:1\na:2\nb:2\n")  # ... and listed again: it rejoins, last
    assert [e[:2] for e in pool.rediscover()] == [("b", "rejoins")]
    assert pool.order == ["a", "d", "b"] and pool.fill(pool.size()) == [("a", 2), ("d", 1),
                                                                        ("b", 1)]


def load_progress_module():
    """A fresh copy of keras_ddl/common/launcher_progress.py."""
    spec = importlib.util.spec_from_file_location(
        "progress_copy", os.path.join(REPO, "src", "keras_ddl", "common", "launcher_progress.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_progress_is_written_only_to_the_pipe_the_variable_names(tmp_path, monkeypatch):
    read_end, write_end = os.pipe()
    try:
        monkeypatch.setenv("DDLRUN_PROGRESS_FD", f"{write_end}:{os.fstat(write_end).st_ino}")
        load_progress_module().report("step", 12)
        assert os.read(read_end, 100) == b"step 12\n"
        with open(tmp_path / "other", "w") as f:  # the number names another file now
            monkeypatch.setenv("DDLRUN_PROGRESS_FD", f"{f.fileno()}:{os.fstat(write_end).st_ino}")
            load_progress_module().report("step", 13)
        assert (tmp_path / "other").read_text() == ""
    finally:
        os.close(read_end)
        os.close(write_end)


# -- launches on fake hosts ----------------------------------------------

def elastic_run(launcher, tmp_path, nprocs, mode, options):
    ssh = script(tmp_path / "fake-ssh", FAKE_SSH)
    return launcher.ddlrun(nprocs, PROBE, mode, str(tmp_path),
                           options=["--launcher-exec", ssh, "--iface", "lo",
                                    "--restart-delay-s", "0.5", *options],
                           timeout=120, cwd=tmp_path, module="keras_ddl_launcher")


def attempts(tmp_path):
    """{attempt: {rank: (size, host)}}."""
    found = {}
    path = tmp_path / "attempts"
    for line in path.read_text().splitlines() if path.exists() else []:
        a, r, s, h = re.fullmatch(r"attempt=(\d+) rank=(\d+) size=(\d+) host=(\S+)", line).groups()
        found.setdefault(int(a), {})[int(r)] = (int(s), h)
    return found


def test_a_host_whose_rank_died_is_left_out_and_the_job_finishes_on_the_rest(launcher, tmp_path):
    proc = elastic_run(launcher, tmp_path, 2, "shrink",
                       ["-H", "fakea:1,fakeb:1", "--min-np", "1", "--max-restarts", "2"])
    assert proc.returncode == 0, output(proc)
    assert attempts(tmp_path) == {0: {0: (2, "fakea"), 1: (2, "fakeb")},
                                  1: {0: (1, "fakea")}}, output(proc)
    assert re.search(r"^ddlrun: fakeb is left out of the next attempts: its rank 1 was the first "
                     r"to end \(killed by SIGKILL\); the job goes on with 1 rank\(s\) on fakea:1 "
                     r"\(was 2\); time lost so far: [\d.]+ s since the job last made progress "
                     r"\(step 7\)$", proc.stderr, re.M), output(proc)
    lost = re.search(r"^ddlrun: back at step 7, where attempt 1 last made progress: ([\d.]+) s "
                     r"lost to the fault = ([\d.]+) s to detect it and end the attempt \+ "
                     r"([\d.]+) s to relaunch and resume from step 5 \+ ([\d.]+) s to redo 2 "
                     r"step\(s\)$", proc.stderr, re.M)
    assert lost, output(proc)
    total, *parts = map(float, lost.groups())
    assert abs(total - sum(parts)) <= 0.15, lost.group(0)  # each part rounded to 0.1 s
    assert float(parts[1]) >= 0.5  # the restart delay is part of the relaunch
    assert "RANK 0 of 1 done in attempt 1" in proc.stdout, output(proc)


def test_too_few_slots_left_end_the_job(launcher, tmp_path):
    proc = elastic_run(launcher, tmp_path, 2, "shrink",
                       ["-H", "fakea:1,fakeb:1", "--min-np", "2", "--max-restarts", "2"])
    assert proc.returncode != 0, output(proc)
    assert sorted(attempts(tmp_path)) == [0], output(proc)
    assert re.search(r"^ddlrun: fakeb is left out of the next attempts: its rank 1 was the first "
                     r"to end \(killed by SIGKILL\); 1 slot\(s\) remain, fewer than --min-np 2; "
                     r"time lost so far: ", proc.stderr, re.M), output(proc)
    assert re.search(r"^ddlrun: the job failed \(exit code \d+\); rank 1 on \S+ ended first "
                     r"\(killed by SIGKILL\).*Giving up: too few slots are left for --min-np 2$",
                     proc.stderr, re.M), output(proc)


def test_discovered_hosts_join_fail_and_rejoin(launcher, tmp_path):
    # Each call of the script lists the next line's hosts (the last one
    # from then on): c cut off in attempt 0 and unlisted; lostd joins and
    # cannot be reached; c listed again rejoins.
    calls = ["fakea:1 fakeb:1 fakec:1", "fakea:1 fakeb:1 lostd:1",
             "fakea:1 fakeb:1 fakec:1 lostd:1"]
    listings = tmp_path / "listings"
    listings.write_text("\n".join(calls) + "\n")
    hosts = script(tmp_path / "hosts.sh", f"""#!/bin/sh
n=$(cat {tmp_path}/calls 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {tmp_path}/calls
line=$(sed -n "${{n}}p" {listings}); [ -n "$line" ] || line=$(tail -n 1 {listings})
for h in $line; do echo $h; done
""")
    proc = elastic_run(launcher, tmp_path, 3, "cut_off",
                       ["--host-discovery-script", hosts, "--min-np", "2", "--max-restarts", "3"])
    assert proc.returncode == 0, output(proc)
    runs = attempts(tmp_path)
    assert runs[0] == {0: (3, "fakea"), 1: (3, "fakeb"), 2: (3, "fakec")}, output(proc)
    assert not any(h == "lostd" for _, h in runs.get(1, {}).values()), output(proc)
    assert runs[2] == runs[0], output(proc)
    expected = [
        r"fakec is left out of the next attempts: every fault diagnosis from the other hosts' "
        r"ranks \(2\) names its rank 2 unreachable, and none of them was heard from after the "
        r"fault; the job goes on with 3 rank\(s\) on fakea:1,fakeb:1,lostd:1 \(was 3\); time lost "
        r"so far: [\d.]+ s since the first rank failed",
        r"lostd joins at restart 1: the discovery script lists it; the job goes on with 3 "
        r"rank\(s\) on fakea:1,fakeb:1,lostd:1 \(was 3\); time lost so far: ",
        # The launcher may exit before it prints the stand-in's error: then
        # ddlrun's own check of the host finds it.
        r"lostd is left out of the next attempts: the launch failed there: its rank 2 never "
        r"started( \(the launcher said: |, and '\S+fake-ssh lostd true' failed \(exit code "
        r"255\): )ssh: connect to host lostd port 22: No route to host\)?; the job goes on with 3 "
        r"rank\(s\) on fakea:1,fakeb:1,fakec:1 \(was 3\)",
        r"fakec rejoins at restart 2: the discovery script lists it again after it had been left "
        r"out and unlisted; the job goes on with 3 rank\(s\) on fakea:1,fakeb:1,fakec:1",
        r"only rank\(s\) \[2\] still run, and every diagnosis names them unreachable",
    ]
    for pattern in expected:
        assert re.search(r"^ddlrun: " + pattern, proc.stderr, re.M), (pattern, output(proc))
    assert (tmp_path / "calls").read_text().strip() == "3", output(proc)
