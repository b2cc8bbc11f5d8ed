"""python -m keras_ddl.cluster run --nodes 2 --ranks-per-node 2 --rate 1gbit -- python train.py
python -m keras_ddl.cluster run --racks 2 --nodes 4 --rate 1gbit --uplink 250mbit -- ...

Builds a cluster of network namespaces (one per node, links capped at
--rate; with --racks, --nodes per rack behind one bridge each, every rack
reaching a core bridge through an uplink capped at --uplink), runs the
command under mpiexec with the ranks spread over the nodes, prints the
bytes each link and uplink carried, and tears the cluster down (also on
Ctrl-C). With racks, every rank sees its place as Slurm gives it
(SLURM_TOPOLOGY_ADDR), unless --no-topology. ``clean`` removes clusters left by killed runs.

With --slurm the cluster also runs a real Slurm (keras_ddl_tools/cluster/slurm.py)
and the command runs on this machine as a Slurm client, for example
``run --slurm --racks 2 --nodes 2 -- srun -N 4 --mpi=pmi2 python train.py``;
Slurm's topology/tree plugin then gives every task SLURM_TOPOLOGY_ADDR.

The ranks run with the Python interpreter that runs this command: a bare
``python`` or ``python3`` as the command's first word becomes that
interpreter's path. Building the cluster needs root, and ``sudo`` resets
PATH, so ``sudo /venv/bin/python -m keras_ddl.cluster run -- python train.py``
would otherwise start the system Python, without the venv's packages.
"""

import argparse
import os
import subprocess
import sys

from .netns import MPI_ENV, ClusterError, NetnsCluster, find_mpiexec, remove_stale_clusters
from .slurm import SlurmError


BARE_PYTHON_NAMES = ("python", "python3")


def with_this_interpreter(command):
    """``command`` with a bare ``python``/``python3`` first word replaced by
    ``sys.executable`` (a path, or any other program, is left as it is).

    Args:
        command: The command line each rank runs, as a list of words.

    Returns:
        A new list.
    """
    if command and command[0] in BARE_PYTHON_NAMES:
        return [sys.executable, *command[1:]]
    return list(command)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m keras_ddl.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="build a cluster, run a command on it, tear it down")
    run.add_argument("--nodes", type=int, default=2, help="nodes (per rack, with --racks)")
    run.add_argument("--racks", type=int, default=1,
                     help="racks of --nodes nodes, each behind its own bridge")
    run.add_argument("--uplink", default=None,
                     help="with --racks: each rack's uplink rate each way (default: --rate)")
    run.add_argument("--no-topology", action="store_true",
                     help="with --racks: tell the ranks nothing about the racks (no "
                          "SLURM_TOPOLOGY_ADDR), as most jobs run")
    run.add_argument("--ranks-per-node", type=int, default=1)
    run.add_argument("--rate", default="1gbit", help="link rate each way: 100mbit, 1gbit, ...")
    run.add_argument("--burst", default=None,
                     help="bytes each link's token bucket holds (64k, 1mb; default: 2 ms at "
                          "the rate, at least 256k); a call that sends less than this after "
                          "an idle moment goes faster than --rate")
    run.add_argument("--shm", default=None,
                     help="give each node a /dev/shm of its own of this size (64m, 1g), as a "
                          "container has (Docker's and Kubernetes' default: 64m); default: the "
                          "machine's, shared by the nodes")
    run.add_argument("--slurm", action="store_true",
                     help="also run a Slurm on the cluster (munge, slurmctld here, one slurmd "
                          "per node under its hostname, topology/tree from the racks) and run "
                          "the command here with SLURM_CONF set, in place of mpiexec: give it "
                          "srun, sbatch or salloc (needs Debian's slurmd, slurmctld, "
                          "slurm-client and munge)")
    run.add_argument("--slurm-cpus", type=int, default=None, metavar="N",
                     help="with --slurm: CPUs each node declares (default: --ranks-per-node)")
    run.add_argument("command", nargs=argparse.REMAINDER,
                     help="what each rank runs, after --; a bare 'python' or 'python3' as its "
                          "first word runs this interpreter (" + sys.executable + "), also "
                          "under sudo, which resets PATH")
    pr = sub.add_parser("probe", help="plain TCP transfers with every node busy: the rates "
                                      "reached against the shaped rates")
    pr.add_argument("--nodes", type=int, default=2, help="nodes (per rack, with --racks)")
    pr.add_argument("--racks", type=int, default=1)
    pr.add_argument("--rate", default="1gbit")
    pr.add_argument("--uplink", default=None)
    pr.add_argument("--burst", default=None)
    pr.add_argument("--json", default=None, help="also write the result here")
    sub.add_parser("clean", help="remove clusters whose owner process is gone")
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.what == "clean":
        remove_stale_clusters()
        return 0
    if args.what == "probe":
        from . import probe
        try:
            return probe.main(args)
        except ClusterError as e:
            print(f"keras_ddl.cluster: {e}", file=sys.stderr)
            return 2
    command = with_this_interpreter(
        args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        p.error("run: no command given")
    try:
        mpiexec = None if args.slurm else find_mpiexec()
        slurm = {"slurm": True, "slurm_cpus": args.slurm_cpus or args.ranks_per_node} \
            if args.slurm else {}
        with NetnsCluster(args.nodes, args.rate, burst=args.burst, racks=args.racks,
                          uplink=args.uplink, tell_topology=not args.no_topology,
                          shm=args.shm, **slurm) as cluster:
            if args.slurm:  # the command is the Slurm client: srun, sbatch, salloc ...
                # srun passes the environment on to the tasks: MPI over TCP,
                # so that the links carry the traffic, as with mpiexec.
                argv, env = command, dict(os.environ, **MPI_ENV, **cluster.slurm.env())
                print(f"+ SLURM_CONF={cluster.slurm.conf}", " ".join(argv), flush=True)
            else:
                argv = [mpiexec, *cluster.mpiexec_args(args.ranks_per_node),
                        "-n", str(cluster.nodes * args.ranks_per_node), *command]
                env = dict(os.environ, **MPI_ENV)
                print("+", " ".join(argv), flush=True)
            before = cluster.link_bytes()
            up_before = cluster.uplink_bytes()
            try:
                code = subprocess.run(argv, env=env).returncode
            except KeyboardInterrupt:
                code = 130
            after = cluster.link_bytes()
            up_after = cluster.uplink_bytes()
            for host, (s0, r0), (s1, r1) in zip(cluster.hosts, before, after):
                print(f"{host}: sent {s1 - s0} bytes, received {r1 - r0} bytes over its link")
            for r, ((o0, i0), (o1, i1)) in enumerate(zip(up_before, up_after)):
                print(f"rack{r + 1} uplink: {o1 - o0} bytes out, {i1 - i0} bytes in")
            return code
    except (ClusterError, SlurmError) as e:
        print(f"keras_ddl.cluster: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
