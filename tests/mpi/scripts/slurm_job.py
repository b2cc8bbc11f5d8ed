"""Under a real Slurm on the test cluster (2 racks x 2 nodes, one task per
node; tests/cluster/test_slurm_cluster.py): the world is Slurm's 4 tasks, one per
node of the allocation, the racks come from Slurm's topology/tree plugin
(SLURM_TOPOLOGY_ADDR), and the rack allreduce runs, bitwise in the
nodes-then-racks order. TensorFlow is imported before MPI starts, as a
training script does: that is what broke MPI_Init under ``srun --mpi=pmi2``
before keras_ddl relayed MPICH's PMI requests (keras_ddl/common/slurm_pmi.py).
Prints DDLCASE lines."""

import os
import socket
import subprocess

import tensorflow as tf  # first, as training scripts do
import numpy as np
from harness import case, run_cases

import keras_ddl as ddl


def allocation_hosts():
    """The allocation's nodes, as Slurm expands SLURM_JOB_NODELIST."""
    out = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


@case
def world_is_slurms_tasks():
    assert ddl.size() == int(os.environ["SLURM_NTASKS"]) == 4, \
        (ddl.size(), os.environ.get("SLURM_NTASKS"))
    assert ddl.rank() == int(os.environ["SLURM_PROCID"]), (ddl.rank(), os.environ["SLURM_PROCID"])
    host = socket.gethostname()
    assert host == os.environ["SLURMD_NODENAME"], (host, os.environ["SLURMD_NODENAME"])
    hosts = ddl.allgather_object(host)
    # One task on each node of the allocation, in Slurm's block order.
    assert hosts == allocation_hosts(), (hosts, allocation_hosts())
    assert ddl.local_size() == 1, ddl.local_size()


@case
def pmi_went_through_the_relay():
    # srun --mpi=pmi2 gave this task a PMI socket, and keras_ddl relayed it.
    assert os.environ.get("SLURM_MPI_TYPE") == "pmi2", os.environ.get("SLURM_MPI_TYPE")
    assert os.environ.get("DDL_PMI_RELAY_ACTIVE") == "1", "the PMI relay did not start"


@case
def racks_from_slurm_topology():
    host = socket.gethostname()
    rack = 1 if host in ("node1", "node2") else 2
    # Slurm's topology/tree plugin, written from the cluster's racks.
    assert os.environ.get("SLURM_TOPOLOGY_ADDR") == f"core.rack{rack}.{host}", \
        os.environ.get("SLURM_TOPOLOGY_ADDR")
    topo = ddl.topology()
    assert topo["source"] == "SLURM_TOPOLOGY_ADDR", topo
    assert topo["racks"] == ["core.rack1", "core.rack2"], topo
    assert topo["rack_of_rank"] == [0, 0, 1, 1] and topo["used"], topo
    assert ddl.allreduce_algorithm() == "racks", ddl.allreduce_algorithm()


@case
def rack_allreduce_bitwise_in_rack_order():
    def inputs(r):
        rng = np.random.default_rng(11 + r)
        return rng.uniform(-1, 1, 300001).astype(np.float32)
    everyone = [inputs(r) for r in range(4)]
    before = ddl.traffic()["rack_bytes"]
    got = ddl.allreduce(tf.constant(everyone[ddl.rank()]), op=ddl.Sum, name="slurm.rack").numpy()
    want = (everyone[0] + everyone[1]) + (everyone[2] + everyone[3])
    assert got.tobytes() == want.tobytes(), float(np.abs(got - want).max())
    assert ddl.traffic()["rack_bytes"] > before, ddl.traffic()


if __name__ == "__main__":
    run_cases()
