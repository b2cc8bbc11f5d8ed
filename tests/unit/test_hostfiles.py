"""ddlrun's hostfiles (src/keras_ddl_launcher/hosts.py): every format users bring
is read, and a line ddlrun does not understand is an error naming the file
and the line, never a word dropped in silence.

The formats: ours (host[:slots][@rack], a rack= column), MPICH's and Intel
MPI's (host:N), Open MPI's and Horovod's (host slots=N, max_slots=M), and the
files the Kubernetes MPI Operator v2beta1 writes into its ConfigMap for
Open MPI and for MPICH / Intel MPI (pkg/controller/mpi_job_controller.go,
newConfigMap: one worker per line, '<job>-worker-<i>.<job>.<namespace>.svc'
then ' slots=N', or ':N')."""

import pytest

from keras_ddl_launcher import ddlrun
from keras_ddl_launcher.hosts import UsageError, hostfile_items, parse_hosts, split_racks


def read(text, source="hosts.txt"):
    """The hostfile as ddlrun reads it: ([(host, slots)], {host: rack})."""
    items, racks = split_racks(hostfile_items(text.splitlines(), source), source)
    return parse_hosts(items, source), racks


def test_ours_with_racks_comments_and_blank_lines():
    hosts, racks = read("# two racks\n\nn1:4@top\n  n2:2 rack=top   # a comment\nn3@bottom\n"
                        "n4:4 rack=bottom\n")
    assert hosts == [("n1", 4), ("n2", 2), ("n3", 1), ("n4", 4)]
    assert racks == {"n1": "top", "n2": "top", "n3": "bottom", "n4": "bottom"}


def test_mpich_and_intel_machinefile():
    assert read("node1:8\nnode2:8\nnode3\n") == ([("node1", 8), ("node2", 8), ("node3", 1)], {})


def test_open_mpi_and_horovod():
    hosts, racks = read("# Open MPI\nnode1 slots=4\nnode2 slots=2 max_slots=8\n"
                        "node3 max-slots=2\nnode4\tslots=4   # tab-separated\n")
    assert hosts == [("node1", 4), ("node2", 2), ("node3", 1), ("node4", 4)] and racks == {}


def test_open_mpi_line_with_a_rack_column():
    hosts, racks = read("a slots=2 rack=r1\nb slots=2 rack=r2\n")
    assert hosts == [("a", 2), ("b", 2)] and racks == {"a": "r1", "b": "r2"}


def test_mpi_operator_open_mpi_file():
    # What the operator writes for `mpiImplementation: OpenMPI`, slotsPerWorker: 4.
    text = ("train-worker-0.train.default.svc slots=4\n"
            "train-worker-1.train.default.svc slots=4\n")
    assert read(text, "/etc/mpi/hostfile") == (
        [("train-worker-0.train.default.svc", 4), ("train-worker-1.train.default.svc", 4)], {})


def test_mpi_operator_mpich_file_with_launcher_as_worker():
    # `mpiImplementation: MPICH` (or Intel), runLauncherAsWorker: the launcher first.
    text = ("train-launcher.train.ns1.svc:2\n"
            "train-worker-0.train.ns1.svc:2\ntrain-worker-1.train.ns1.svc:2\n")
    hosts, _ = read(text)
    assert hosts == [("train-launcher.train.ns1.svc", 2), ("train-worker-0.train.ns1.svc", 2),
                     ("train-worker-1.train.ns1.svc", 2)]


@pytest.mark.parametrize("text, line, words", [
    ("a:2\nb slots=2 cpus=4\n", 2, "'cpus=4' is not understood"),
    ("a slots=2 extra\n", 1, "'extra' is not understood"),
    ("a:2\n\n# c\nb slots=two\n", 4, "slots= 'two' is not a whole number >= 1"),
    ("a slots=0\n", 1, "slots= '0' is not a whole number >= 1"),
    ("a max_slots=x\n", 1, "max_slots= 'x' is not a whole number >= 1"),
    ("a:x\n", 1, "'a:x' is not host or host:slots"),
    ("a:0\n", 1, "'a:0' is not host or host:slots"),
    ("a:2 slots=2\n", 1, "the slots are given twice ('a:2' and 'slots=2')"),
    ("a slots=2 slots=3\n", 1, "the slots are given twice"),
    ("a@r1 rack=r2\n", 1, "the rack is given twice"),
    ("a slots=4 max_slots=2\n", 1, "slots=4 is more than max_slots=2"),
    ("a rack=b/c\n", 1, "the rack 'b/c' must be a name"),
    ("a@\n", 1, "the rack '' must be a name"),
    ("a/b slots=1\n", 1, "'a/b' does not start with a host name"),
    ("=4\n", 1, "'=4' does not start with a host name"),
    ("a:2\nb:2\na slots=2\n", 3, "host 'a' is listed twice (first on line 1)"),
])
def test_a_line_not_understood_names_file_and_line(text, line, words):
    with pytest.raises(UsageError) as err:
        read(text, "cluster.hosts")
    message = str(err.value)
    assert message.startswith(f"cluster.hosts:{line}: ") and words in message, message


def test_racks_for_some_hosts_only_is_an_error():
    with pytest.raises(UsageError, match="hosts b name no rack but others do"):
        read("a slots=2 rack=r1\nb slots=2\n")


def test_ddlrun_launches_on_an_open_mpi_hostfile(capsys, tmp_path):
    """Through ddlrun's command line: the slots of 'host slots=N' reach the
    launcher, and a bad line is ddlrun's usage error naming the line."""
    train = tmp_path / "train.py"
    train.write_text("")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w0.job.ns.svc slots=3\nw1.job.ns.svc slots=3 max_slots=6\n")
    assert ddlrun.main(["-np", "6", "--hostfile", str(hostfile), "--dry-run",
                        "--launcher-exec", "true", "python", str(train)]) == 0
    assert "-hosts w0.job.ns.svc:3,w1.job.ns.svc:3" in capsys.readouterr().out
    hostfile.write_text("w0 slots=3\nw1 slot=3\n")
    with pytest.raises(SystemExit) as exit_info:
        ddlrun.main(["-np", "6", "--hostfile", str(hostfile), "--dry-run", "python", str(train)])
    assert exit_info.value.code == 2
    assert f"{hostfile}:2: 'slot=3' is not understood" in capsys.readouterr().err
