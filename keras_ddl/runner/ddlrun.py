"""ddlrun: start ``python train.py`` on N processes with the DDL_ environment.

    ddlrun -np 4 python train.py --epochs 90
    ddlrun -np 8 -H node1:4,node2:4 --hierarchical python train.py
    ddlrun -np 16 --hostfile hosts.txt --fusion-threshold-mb 32 python train.py

It builds an ``mpiexec`` command line for the installed MPI (MPICH's hydra
or Open MPI, found next to this Python first), exports the DDL_* settings to
every rank, and exits with the launched job's exit code. ``--launcher srun``
uses Slurm's ``srun`` instead (inside an allocation). ``--dry-run`` prints
the command without running it.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from .deathwatch import DeathWatch

HOST_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+(:[1-9][0-9]*)?$")


class UsageError(ValueError):
    pass


def build_parser():
    p = argparse.ArgumentParser(
        prog="ddlrun", description="Launch a keras_ddl training script on N processes.",
        epilog="Everything after the options is the command each rank runs.")
    p.add_argument("-np", "--num-proc", type=int, required=True, dest="np",
                   help="total number of processes (ranks)")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="comma-separated host[:slots] list")
    hosts.add_argument("--hostfile", help="file with one host[:slots] per line")
    p.add_argument("--fusion-threshold-mb", type=float,
                   help="largest fused allreduce batch in MB (DDL_FUSION_THRESHOLD_MB)")
    p.add_argument("--cycle-time-ms", type=float, help="negotiation cycle (DDL_CYCLE_TIME_MS)")
    algo = p.add_mutually_exclusive_group()
    algo.add_argument("--hierarchical", action="store_true",
                      help="shared memory inside a node, MPI across nodes")
    algo.add_argument("--flat", action="store_true", help="flat ring over MPI")
    p.add_argument("--local-size", type=int,
                   help="ranks per (virtual) node, for testing hierarchical paths (DDL_LOCAL_SIZE)")
    p.add_argument("--timeline", help="write a Chrome-trace timeline to this file (DDL_TIMELINE)")
    p.add_argument("--stall-timeout-s", type=float,
                   help="fail every rank when a collective waits this long (DDL_STALL_TIMEOUT_S)")
    p.add_argument("--bind-to-core", action="store_true",
                   help="pin each rank to one core (and TF to one intra-op thread)")
    p.add_argument("--launcher", choices=["mpiexec", "srun"], default="mpiexec")
    p.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    p.add_argument("command", nargs=argparse.REMAINDER, help="program and its arguments")
    return p


def parse_hosts(spec, source):
    hosts = []
    for item in spec:
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        if not HOST_PATTERN.match(item):
            raise UsageError(f"{source}: '{item}' is not host or host:slots (slots >= 1)")
        name, _, slots = item.partition(":")
        hosts.append((name, int(slots) if slots else 1))
    if not hosts:
        raise UsageError(f"{source}: no hosts given")
    return hosts


def validate(args):
    if not args.command:
        raise UsageError("no command given: ddlrun -np N python train.py ...")
    if args.np < 1:
        raise UsageError(f"-np must be >= 1, got {args.np}")
    program = shutil.which(args.command[0]) or (args.command[0] if os.path.exists(args.command[0])
                                                 else None)
    if program is None:
        raise UsageError(f"program '{args.command[0]}' not found")
    if os.path.basename(args.command[0]).startswith("python") and len(args.command) > 1:
        script = args.command[1]
        if script.endswith(".py") and not os.path.isfile(script):
            raise UsageError(f"script '{script}' does not exist")
    env = {}
    if args.fusion_threshold_mb is not None:
        if not 0 <= args.fusion_threshold_mb <= 65536:
            raise UsageError(f"--fusion-threshold-mb must be in [0, 65536], got {args.fusion_threshold_mb}")
        env["DDL_FUSION_THRESHOLD_MB"] = repr(args.fusion_threshold_mb)
    if args.cycle_time_ms is not None:
        if not 0.01 <= args.cycle_time_ms <= 10000:
            raise UsageError(f"--cycle-time-ms must be in [0.01, 10000], got {args.cycle_time_ms}")
        env["DDL_CYCLE_TIME_MS"] = repr(args.cycle_time_ms)
    if args.hierarchical:
        env["DDL_ALLREDUCE"] = "hierarchical"
    elif args.flat:
        env["DDL_ALLREDUCE"] = "flat"
    if args.local_size is not None:
        if args.local_size < 1 or args.np % args.local_size:
            raise UsageError(f"--local-size {args.local_size} must be >= 1 and divide -np {args.np}")
        env["DDL_LOCAL_SIZE"] = str(args.local_size)
    if args.timeline:
        directory = os.path.dirname(os.path.abspath(args.timeline))
        if not os.path.isdir(directory):
            raise UsageError(f"--timeline: directory {directory} does not exist")
        env["DDL_TIMELINE"] = os.path.abspath(args.timeline)
    if args.stall_timeout_s is not None:
        if args.stall_timeout_s < 0:
            raise UsageError(f"--stall-timeout-s must be >= 0, got {args.stall_timeout_s}")
        env["DDL_STALL_TIMEOUT_S"] = repr(args.stall_timeout_s)
    if args.bind_to_core:
        env["TF_NUM_INTRAOP_THREADS"] = "1"
        env["TF_NUM_INTEROP_THREADS"] = "1"
        env["OMP_NUM_THREADS"] = "1"
    hosts = None
    if args.hosts:
        hosts = parse_hosts(args.hosts.split(","), "-H")
    elif args.hostfile:
        if not os.path.isfile(args.hostfile):
            raise UsageError(f"--hostfile {args.hostfile} does not exist")
        with open(args.hostfile) as f:
            hosts = parse_hosts([line.split()[0] if line.split() else "" for line in f],
                                args.hostfile)
    if hosts is not None and sum(s for _, s in hosts) < args.np:
        raise UsageError(f"-np {args.np} exceeds the {sum(s for _, s in hosts)} slots of the hosts given")
    return env, hosts


def find_mpiexec():
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    path = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if path is None:
        raise UsageError("mpiexec not found: install the mpich wheel or put your MPI's bin/ on PATH")
    return path


def mpi_flavour(mpiexec):
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    return "openmpi" if "Open MPI" in text or "OpenRTE" in text else "mpich"


def build_command(args, env, hosts):
    if args.launcher == "srun":
        cmd = ["srun", "-n", str(args.np)]
        if args.bind_to_core:
            cmd.append("--cpu-bind=cores")
        return cmd + args.command  # srun exports the caller's environment by default
    mpiexec = find_mpiexec()
    cmd = [mpiexec, "-n", str(args.np)]
    if mpi_flavour(mpiexec) == "openmpi":
        for key in env:
            cmd += ["-x", key]
        if hosts:
            cmd += ["-H", ",".join(f"{h}:{s}" for h, s in hosts)]
        if args.bind_to_core:
            cmd += ["--bind-to", "core"]
    else:  # MPICH hydra passes the whole environment by default
        if hosts:
            cmd += ["-hosts", ",".join(f"{h}:{s}" for h, s in hosts)]
        if args.bind_to_core:
            cmd += ["-bind-to", "core"]
    return cmd + args.command


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    try:
        env, hosts = validate(args)
        cmd = build_command(args, env, hosts)
    except UsageError as e:
        parser.error(str(e))
    if args.dry_run:
        print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(cmd))
        return 0
    child_env = dict(os.environ)
    child_env.update(env)
    return run_and_name_first_death(cmd, child_env, args.np)


def run_and_name_first_death(cmd, env, ranks):
    """Runs the launcher; if the job fails, says which rank ended first.

    MPICH's launcher reports a dead rank by a PID (not always the first to
    die); Slurm and Open MPI name a task but not why the others stopped. The
    ranks on this host register at init, and a DeathWatch sees the order in
    which they end."""
    with tempfile.TemporaryDirectory(prefix="ddlrun_ranks_") as registry:
        env = dict(env, DDL_RANK_REGISTRY=registry)
        watch = DeathWatch(registry, ranks).start()
        try:
            try:
                code = subprocess.run(cmd, env=env).returncode
            except KeyboardInterrupt:
                code = 130
        finally:
            watch.stop()
        if code != 0 and watch.deaths:
            when, first = watch.deaths[0]
            who = (f"rank {first[0]}" if len(first) == 1
                   else "one of ranks " + ", ".join(map(str, first)))
            sys.stderr.write(f"ddlrun: the job failed (exit code {code}); {who} on {watch.host} "
                             f"ended first, {when:.1f} s after launch, and the launcher then "
                             "stopped the others\n")
            sys.stderr.flush()
        return code


if __name__ == "__main__":
    sys.exit(main())
