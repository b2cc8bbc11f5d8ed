"""The recipes of docs/your_cluster.md that can run here.

- docs/kubernetes/mpijob.yaml is a complete MPIJob (MPICH, GPU limits, a
  memory-backed /dev/shm, ssh), and its launcher command, as written, trains
  the quickstart on the 2-node network-namespace cluster against a hostfile
  in the format the MPI Operator writes for MPICH. Two things are this
  machine's, not the manifest's: the namespaces have no sshd, so ddlrun gets
  the cluster's ssh stand-in (behind a wrapper that reads a pod's DNS name
  the way Kubernetes' DNS would, by its first label), and ``--iface`` names
  the bridge the nodes reach this machine by.
- docker/Dockerfile installs with the README's command, as written, and
  runs sshd. It is not built here: this machine has no Docker engine.
"""

import os
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFEST = os.path.join(REPO, "docs", "kubernetes", "mpijob.yaml")
DOCKERFILE = os.path.join(REPO, "docker", "Dockerfile")
OPERATOR_HOSTFILE = "/etc/mpi/hostfile"   # where the operator mounts it in the launcher


@pytest.fixture(scope="module")
def mpijob():
    with open(MANIFEST) as f:
        return yaml.safe_load(f)


def _container(mpijob, replica):
    return mpijob["spec"]["mpiReplicaSpecs"][replica]["template"]["spec"]["containers"][0]


def test_manifest_is_a_complete_mpich_mpijob(mpijob):
    spec = mpijob["spec"]
    assert (mpijob["apiVersion"], mpijob["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert spec["mpiImplementation"] == "MPICH" and spec["sshAuthMountPath"] == "/root/.ssh"
    slots, workers = spec["slotsPerWorker"], spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    worker = _container(mpijob, "Worker")
    # One rank per GPU: the GPU limit is the slots per worker.
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == slots
    assert "command" not in worker and "args" not in worker   # the operator's sshd -De
    mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    volumes = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]
    shm = next(v for v in volumes if v["name"] == mounts["/dev/shm"])
    assert shm["emptyDir"]["medium"] == "Memory", shm
    command = _container(mpijob, "Launcher")["command"]
    assert command[0] == "ddlrun"
    assert command[command.index("--hostfile") + 1] == OPERATOR_HOSTFILE
    assert int(command[command.index("-np") + 1]) == slots * workers


def test_dockerfile_installs_with_the_readme_command_and_runs_sshd():
    with open(os.path.join(REPO, "README.md")) as f:
        install = next(line for line in f.read().splitlines() if line.endswith("# (1) install"))
    with open(DOCKERFILE) as f:
        lines = f.read().splitlines()
    assert f"RUN {install}" in lines, install
    assert 'CMD ["/usr/sbin/sshd", "-De"]' in lines
    assert any("openssh-server" in line for line in lines)


def test_mpijob_launcher_command_trains_on_the_cluster(launcher, mpijob, tmp_path):
    from keras_ddl_tools.cluster import MPI_ENV
    cluster = launcher.cluster(2)
    name, namespace = mpijob["metadata"]["name"], "default"
    slots = mpijob["spec"]["slotsPerWorker"]
    # What the operator writes for MPICH: '<pod>.<job>.<namespace>.svc:<slots>'.
    # The pods here are the cluster's nodes.
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{host}.{name}.{namespace}.svc:{slots}\n"
                                for host in cluster.hosts))
    # A pod's DNS name, read by its first label: the node's name. The
    # launcher calls this as ssh, options first, so every word is looked at.
    reach = tmp_path / "reach-pod"
    reach.write_text("#!/bin/sh\n"
                     'for a; do shift; case "$a" in *.svc) a=${a%%.*};; esac; set -- "$@" "$a"; done\n'
                     f'exec {cluster.standin} "$@"\n')
    reach.chmod(0o755)
    command = _container(mpijob, "Launcher")["command"]
    argv = [sys.executable, "-m", "keras_ddl_launcher", "--launcher-exec", str(reach),
            "--iface", cluster.bridge]
    for word in command[1:]:
        argv.append({OPERATOR_HOSTFILE: str(hostfile), "python": sys.executable}.get(word, word))
    # The launcher's workingDir is the source tree; the quickstart's
    # checkpoint lands beside it, so this runs in a copy's place.
    workdir = tmp_path / "work"
    workdir.mkdir()
    os.symlink(os.path.join(REPO, "examples"), workdir / "examples")
    proc = launcher.command(argv, env=MPI_ENV, timeout=300, cwd=str(workdir))
    shown = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, shown
    assert f"QUICKSTART ranks={slots * len(cluster.hosts)} " in proc.stdout, shown
    assert (workdir / "quickstart_model.keras").exists(), shown
