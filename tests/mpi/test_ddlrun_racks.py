"""ddlrun's racks: -H host:slots@rack and a hostfile's rack column become
DDL_TOPOLOGY for every rank; mixing hosts with and without racks, or a bad
rack name, is a usage error; --verbose makes rank 0 print the topology the
ranks agreed on, and shows TensorFlow's start-up lines."""

import os
import re
import socket
import subprocess
import sys

import pytest

from keras_ddl_launcher import ddlrun

DDLRUN = [sys.executable, "-m", "keras_ddl_launcher.ddlrun"]


def dry_run(argv, capsys):
    assert ddlrun.main(["--dry-run", *argv, "true"]) == 0
    return capsys.readouterr().out


def test_racks_from_hosts_become_ddl_topology(capsys):
    out = dry_run(["-np", "8", "-H", "n1:2@r1,n2:2@r1,n3:2@r2,n4:2@r2"], capsys)
    assert "DDL_TOPOLOGY=r1=n1,n2;r2=n3,n4" in out
    assert "-hosts n1:2,n2:2,n3:2,n4:2" in out


def test_racks_from_a_hostfile_column_or_suffix(capsys, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two racks\nn1:4 rack=top\nn2:4@top\nn3:4 rack=bottom  # comment\n")
    out = dry_run(["-np", "12", "--hostfile", str(hostfile)], capsys)
    assert "DDL_TOPOLOGY=top=n1,n2;bottom=n3" in out and "-hosts n1:4,n2:4,n3:4" in out


def test_no_racks_no_topology(capsys):
    assert "DDL_TOPOLOGY" not in dry_run(["-np", "4", "-H", "n1:2,n2:2"], capsys)


@pytest.mark.parametrize("hosts, words", [
    ("n1:2@r1,n2:2", "hosts n2 name no rack but others do"),
    ("n1:2@r/1,n2:2@r2", "the rack after '@' must be a name"),
    ("n1:2@,n2:2@r2", "the rack after '@' must be a name"),
])
def test_bad_racks_are_usage_errors(hosts, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ddlrun.main(["-np", "2", "-H", hosts, "true"])
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def test_verbose_prints_the_agreed_topology_once(tmp_path):
    host = socket.gethostname()
    script = tmp_path / "job.py"
    script.write_text("import sys\nimport keras_ddl as ddl\nddl.init()\n"
                      "print('algorithm', ddl.allreduce_algorithm(), flush=True)\n"
                      "sys.stderr.write('the user said so\\n')\n"
                      "ddl.shutdown()\n")
    # TensorFlow's own log level (0, its default): its start-up lines are written.
    proc = subprocess.run(DDLRUN + ["-np", "2", "--verbose", "-H", f"{host}:2@rackA",
                                    sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # --verbose shows TensorFlow's start-up lines (hidden by default:
    # test_rank_output.py), with the user's own.
    for rank in (0, 1):
        for words in ("absl::InitializeLog", "oneDNN custom operations", "the user said so"):
            assert re.search(rf"^\[{rank}\] .*{re.escape(words)}", proc.stderr, re.M), \
                (rank, words, proc.stderr[-3000:])
    assert "ddlrun: TensorFlow's start-up lines" not in proc.stderr
    printed = [line for line in (proc.stdout + proc.stderr).splitlines()
               if "[keras_ddl] topology:" in line]
    assert len(printed) == 1, proc.stdout + proc.stderr
    assert "one switch: 1 node(s) (DDL_TOPOLOGY); 2 rank(s) per node; allreduce: " \
        "shared_memory" in printed[0], printed
