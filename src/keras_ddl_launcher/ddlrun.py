"""ddlrun: start ``python train.py`` on N processes with the DDL_ environment.

    ddlrun -np 4 python train.py --epochs 90
    ddlrun -np 8 -H node1:4,node2:4 --hierarchical python train.py
    ddlrun -np 16 --hostfile hosts.txt --fusion-threshold-mb 32 python train.py
    ddlrun -np 4 -H node1:2,node2:2 --launcher-exec ./my-ssh --iface eth1 -l python train.py
    ddlrun -np 8 --min-np 4 --max-restarts 5 --host-discovery-script ./hosts.sh python train.py

It builds an ``mpiexec`` command line for the installed MPI (MPICH's hydra
or Open MPI, found next to this Python first), exports the DDL_* settings to
every rank, and exits with the launched job's exit code. ``--launcher srun``
uses Slurm's ``srun`` instead (inside an allocation). ``--dry-run`` prints
the command without running it.

Across hosts: every host must have the same Python, keras_ddl and script
paths, and the launcher reaches them with ssh; ``--launcher-exec PATH`` names
another program to use in ssh's place (called as ``PATH [options] HOST
COMMAND...``; MPICH ``-launcher ssh -launcher-exec``, Open MPI ``--mca
plm_rsh_agent``). ``--iface NAME`` is the network interface the other hosts
reach this one by: the launcher's control connections use it (MPICH
``-iface``, Open MPI ``oob/btl_tcp_if_include``) and so does ddlrun's own
socket. ``--mpi-args "..."`` passes further options to the launcher. MPICH
gives every rank ddlrun's whole environment; with Open MPI, ddlrun exports
the DDL_, TF_, KERAS_, UCX_, OMP_, NCCL_, CUDA_, PYTHON* and HOROVOD_
variables, PATH and LD_LIBRARY_PATH.

Each rank runs under a small agent (agent.py) that connects back to ddlrun:
ddlrun prints every rank's output one whole line at a time (``-l``: prefixed
with ``[rank] ``, as ``mpiexec -l`` does; the launcher's own prefixing splits
long lines), and when the job fails it names the rank that ended first and
its host (``rank 3 on node2 ended first (killed by SIGKILL)``), wherever it
ran. An agent that cannot reach ddlrun runs its rank without it, with a
warning. ``ddlrun`` (the command) does not import TensorFlow.

TensorFlow's start-up lines (absl's "All log messages before
absl::InitializeLog()", the oneDNN and CPU-feature notices, "Could not find
cuda drivers" and the cuInit failure after it, CUDA's "Unable to register
... factory") are left out of the relayed output, with one line saying so;
``--verbose`` shows them (startup_lines.py). Nothing else is hidden.

``--max-restarts N`` relaunches a failed job (restart.py); with
``--min-np``, ``--max-np`` or ``--host-discovery-script`` each relaunch
runs on the hosts that are left, without those found to blame for the
failure (elastic.py).
"""

import argparse
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading

from .agent import TOKEN_VARIABLE
from .deathwatch import DeathWatch
from .hosts import (DiscoveryScript, UsageError, hostfile_items, is_this_host, launch_check,
                    parse_hosts, read_hostfile, split_racks, topology_env)
from .startup_lines import StartupLines
from . import settings

AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py")
# With these set, mpiexec may place ranks on other hosts without -H.
ALLOCATION_VARIABLES = ("HYDRA_HOST_FILE", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID",
                        "PE_HOSTFILE")
# What Open MPI's mpiexec exports to the ranks (it exports nothing by default).
OPENMPI_EXPORT_PREFIXES = ("DDL_", "TF_", "KERAS_", "UCX_", "OMP_", "NCCL_", "CUDA_", "PYTHON",
                           "HOROVOD_")  # mapped to DDL_* twins at init (horovod_env.py)
OPENMPI_EXPORT_NAMES = ("PATH", "LD_LIBRARY_PATH", TOKEN_VARIABLE, "DDLRUN_RESTART_COUNT")
# Between a failed attempt and the next under --max-restarts: time for the
# failed job's ports and shared memory to be released, and for a scheduler's
# SIGTERM that reached the ranks first to reach ddlrun too.
DEFAULT_RESTART_DELAY_S = 3.0


def build_parser():
    p = argparse.ArgumentParser(
        prog="ddlrun", description="Launch a keras_ddl training script on N processes.",
        epilog="Everything after the options is the command each rank runs. Across hosts "
               "(same Python and paths on each): ddlrun -np 4 -H node1:2,node2:2 "
               "[--launcher-exec PATH] [--iface NAME] -l python train.py; if the job fails, "
               "ddlrun names the rank that ended first and its host.")
    p.add_argument("-np", "--num-proc", type=int, required=True, dest="np",
                   help="total number of processes (ranks); with --min-np, --max-np or "
                        "--host-discovery-script, the slots the job needs to start (it runs "
                        "on as many as --max-np allows)")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="comma-separated host[:slots][@rack] list (racks: "
                                              "docs/topology.md)")
    hosts.add_argument("--hostfile", help="file with one host per line: host[:slots][@rack] "
                                          "(ours, MPICH's), or 'host slots=N' (Open MPI's, "
                                          "Horovod's, the MPI Operator's), with an optional "
                                          "rack=NAME column")
    hosts.add_argument("--host-discovery-script", metavar="PATH",
                       help="executable that prints the hosts available now, one host[:slots] "
                            "per line (horovodrun's contract); run at start and before every "
                            "restart (with --max-restarts)")
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
    p.add_argument("--launcher", choices=["mpiexec", "srun"], default="mpiexec",
                   help="how the ranks are started: mpiexec (the default; over ssh with -H "
                        "or --hostfile) or Slurm's srun inside an allocation")
    p.add_argument("--launcher-exec", metavar="PATH",
                   help="program to reach other hosts in place of ssh, called as "
                        "'PATH [options] HOST COMMAND...' (MPICH: -launcher ssh -launcher-exec; "
                        "Open MPI: --mca plm_rsh_agent)")
    p.add_argument("--iface", metavar="NAME",
                   help="network interface by which the other hosts reach this one, for the "
                        "launcher's control connections and ddlrun's (MPICH: -iface)")
    p.add_argument("--mpi-args", metavar="ARGS", default="",
                   help="more options for the launcher, split like a shell does, "
                        "e.g. --mpi-args=-verbose or --mpi-args \"-bind-to core\"")
    p.add_argument("-l", "--prefix-output", action=argparse.BooleanOptionalAction, default=True,
                   help="prefix every output line with [rank] (as mpiexec -l; the default); "
                        "lines are never split or mixed, with or without it")
    p.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    p.add_argument("--verbose", action="store_true",
                   help="rank 0 prints the topology the ranks agreed on (racks, nodes, where "
                        "they were learnt) and the allreduce chosen, once at init; and every "
                        "rank's TensorFlow start-up lines are shown (absl's 'All log messages "
                        "before absl::InitializeLog()', the oneDNN and CPU-feature notices, "
                        "'Could not find cuda drivers' and the cuInit failure after it, CUDA's "
                        "'Unable to register ... factory', TF-TRT's warning), which ddlrun "
                        "otherwise hides, saying so in one line; no other line is ever hidden")
    add_restart_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="program and its arguments")
    return p


def add_restart_options(p):
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="when a rank fails, end the job and launch it again on the same hosts, "
                        "at most N times (the script resumes from its BackupAndRestore "
                        "directory); a signal to ddlrun (Ctrl-C, SIGTERM) is never restarted")
    p.add_argument("--restart-delay-s", type=float, metavar="S",
                   help=f"seconds between a failed attempt and the next (default "
                        f"{DEFAULT_RESTART_DELAY_S:g})")
    p.add_argument("--min-np", "--min-num-proc", type=int, metavar="N", dest="min_np",
                   help="with --max-restarts: restart on the hosts that are left, leaving out "
                        "hosts found to blame for a failure, while they hold at least N slots "
                        "(default: -np)")
    p.add_argument("--max-np", "--max-num-proc", type=int, metavar="M", dest="max_np",
                   help="with --max-restarts: at most M ranks when a restart finds more slots "
                        "(default: -np)")
    p.add_argument("--slots-per-host", type=int, metavar="K",
                   help="slots of a host the discovery script lists without :slots (default 1)")


def validate_restarts(args):
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.restart_delay_s is None:
        args.restart_delay_s = DEFAULT_RESTART_DELAY_S
    elif args.max_restarts == 0:
        raise UsageError("--restart-delay-s applies with --max-restarts N (N >= 1) only")
    elif not 0 <= args.restart_delay_s <= 3600:  # also refuses nan
        raise UsageError(f"--restart-delay-s must be in [0, 3600] seconds, got "
                         f"{args.restart_delay_s}")


def is_elastic(args):
    return (args.min_np is not None or args.max_np is not None
            or args.host_discovery_script is not None)


def validate_elastic(args):
    """Checks --min-np, --max-np, --slots-per-host and their company;
    fills in their defaults (-np)."""
    if args.slots_per_host is not None:
        if args.host_discovery_script is None:
            raise UsageError("--slots-per-host applies with --host-discovery-script only")
        if args.slots_per_host < 1:
            raise UsageError(f"--slots-per-host must be >= 1, got {args.slots_per_host}")
    if not is_elastic(args):
        return
    flags = "--min-np, --max-np and --host-discovery-script"
    if args.max_restarts < 1:
        raise UsageError(f"{flags} apply with --max-restarts N (N >= 1): they choose the hosts "
                         "of each restart")
    if args.launcher != "mpiexec":
        raise UsageError(f"{flags} apply with --launcher mpiexec only (srun places the tasks "
                         "itself)")
    if args.hosts is None and args.hostfile is None and args.host_discovery_script is None:
        raise UsageError("--min-np and --max-np need the hosts to choose from: -H, --hostfile "
                         "or --host-discovery-script")
    if args.local_size is not None:
        raise UsageError(f"--local-size applies to a fixed world size, not with {flags}")
    args.min_np = args.np if args.min_np is None else args.min_np
    args.max_np = args.np if args.max_np is None else args.max_np
    if args.min_np < 1:
        raise UsageError(f"--min-np must be >= 1, got {args.min_np}")
    if args.min_np > args.np:
        raise UsageError(f"--min-np {args.min_np} exceeds -np {args.np}")
    if args.max_np < args.np:
        raise UsageError(f"--max-np {args.max_np} is below -np {args.np}")


def elastic_plan(args, env, hosts, racks, discovery):
    from .elastic import ElasticPlan, HostPool

    def command_for(attempt_hosts, size, address):
        return build_command(args, env, attempt_hosts, agent_address=address, np=size)

    def can_launch(host):
        return None if is_this_host(host) else launch_check(args.launcher_exec, host)

    pool = HostPool(hosts, racks, args.min_np, args.max_np, discovery)
    return ElasticPlan(pool, command_for, env, can_launch=can_launch)


def run_restarting(args, env, hosts, racks, discovery):
    """--max-restarts N: every attempt has its own death watch (and token);
    see restart.py (and elastic.py with --min-np, --max-np or
    --host-discovery-script)."""
    from . import restart  # only here: ddlrun --help loads as little as it can

    if is_elastic(args):
        plan = elastic_plan(args, env, hosts, racks, discovery)
    else:
        plan = restart.SameHosts(
            lambda address: build_command(args, env, hosts, agent_address=address), env)
    return restart.run_with_restarts(plan, args.prefix_output, control_address(args, hosts),
                                     args.max_restarts, args.restart_delay_s,
                                     launcher_shares_terminal, StartupLines(show=args.verbose))


def check_setting(option, variable, value):
    """The range of `variable` in the settings table (custom_ops/common/
    settings.def), which the core compiles too."""
    if not settings.valid(variable, value):
        s = settings.SETTINGS[variable]
        bounds = f">= {s.low:g}" if s.high >= 1e9 else f"in [{s.low:g}, {s.high:g}]"
        raise UsageError(f"{option} must be {bounds}, got {value}")


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
    validate_restarts(args)
    validate_elastic(args)
    env = {}
    if args.fusion_threshold_mb is not None:
        check_setting("--fusion-threshold-mb", "DDL_FUSION_THRESHOLD_MB", args.fusion_threshold_mb)
        env["DDL_FUSION_THRESHOLD_MB"] = repr(args.fusion_threshold_mb)
    if args.cycle_time_ms is not None:
        check_setting("--cycle-time-ms", "DDL_CYCLE_TIME_MS", args.cycle_time_ms)
        env["DDL_CYCLE_TIME_MS"] = repr(args.cycle_time_ms)
    if args.hierarchical:
        env["DDL_ALLREDUCE"] = "hierarchical"
    elif args.flat:
        env["DDL_ALLREDUCE"] = "flat"
    if args.local_size is not None:
        if not settings.valid("DDL_LOCAL_SIZE", args.local_size) or args.np % args.local_size:
            raise UsageError(f"--local-size {args.local_size} must be >= 1 and divide -np {args.np}")
        env["DDL_LOCAL_SIZE"] = str(args.local_size)
    if args.timeline:
        directory = os.path.dirname(os.path.abspath(args.timeline))
        if not os.path.isdir(directory):
            raise UsageError(f"--timeline: directory {directory} does not exist")
        env["DDL_TIMELINE"] = os.path.abspath(args.timeline)
    if args.stall_timeout_s is not None:
        check_setting("--stall-timeout-s", "DDL_STALL_TIMEOUT_S", args.stall_timeout_s)
        env["DDL_STALL_TIMEOUT_S"] = repr(args.stall_timeout_s)
    if args.bind_to_core:
        env["TF_NUM_INTRAOP_THREADS"] = "1"
        env["TF_NUM_INTEROP_THREADS"] = "1"
        env["OMP_NUM_THREADS"] = "1"
    if args.launcher_exec is not None:
        if args.launcher != "mpiexec":
            raise UsageError("--launcher-exec applies to --launcher mpiexec only")
        found = shutil.which(args.launcher_exec)
        if found is None:
            raise UsageError(f"--launcher-exec {args.launcher_exec}: not an executable program")
        args.launcher_exec = os.path.abspath(found)
    if args.iface is not None and interface_address(args.iface) is None:
        raise UsageError(f"--iface {args.iface}: no network interface of that name with an "
                         "IPv4 address here")
    try:
        args.mpi_args = shlex.split(args.mpi_args)
    except ValueError as e:
        raise UsageError(f"--mpi-args {args.mpi_args!r}: {e}") from None
    hosts, racks, discovery = None, {}, None
    if args.hosts:
        items, racks = split_racks(args.hosts.split(","), "-H")
        hosts = parse_hosts(items, "-H")
    elif args.hostfile:
        if not os.path.exists(args.hostfile):
            raise UsageError(f"--hostfile {args.hostfile} does not exist")
        items, racks = split_racks(hostfile_items(read_hostfile(args.hostfile), args.hostfile),
                                   args.hostfile)
        hosts = parse_hosts(items, args.hostfile)
    elif args.host_discovery_script:
        discovery = DiscoveryScript(args.host_discovery_script, args.slots_per_host or 1)
        hosts, racks = discovery.run()
    if hosts is not None:
        env.update(topology_env(hosts, racks))
    if getattr(args, "verbose", False):
        env["DDL_PRINT_TOPOLOGY"] = "1"
    if hosts is not None and sum(s for _, s in hosts) < args.np:
        source = "listed by the discovery script" if discovery else "of the hosts given"
        raise UsageError(f"-np {args.np} exceeds the {sum(s for _, s in hosts)} slots {source}")
    return env, hosts, racks, discovery


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


def build_command(args, env, hosts, agent_address="HOST:PORT", np=None):
    """The launcher's command line for ``np`` ranks (default -np); each rank
    runs the command under its agent, which connects back to
    ``agent_address``."""
    np = args.np if np is None else np
    ranks_run = [sys.executable, "-I", AGENT, agent_address, "--"] + args.command
    if args.launcher == "srun":
        cmd = ["srun", "-n", str(np), *srun_pmi_option(args.mpi_args)]
        if args.bind_to_core:
            cmd.append("--cpu-bind=cores")
        return cmd + args.mpi_args + ranks_run  # srun exports the caller's environment
    mpiexec = find_mpiexec()
    cmd = [mpiexec, "-n", str(np)]
    if mpi_flavour(mpiexec) == "openmpi":
        names = set(env) | {k for k in os.environ if k.startswith(OPENMPI_EXPORT_PREFIXES)}
        names |= {k for k in OPENMPI_EXPORT_NAMES if k in os.environ or k == TOKEN_VARIABLE}
        for key in sorted(names):
            cmd += ["-x", key]
        if hosts:
            cmd += ["-H", ",".join(f"{h}:{s}" for h, s in hosts)]
        if args.bind_to_core:
            cmd += ["--bind-to", "core"]
        if args.launcher_exec:
            cmd += ["--mca", "plm_rsh_agent", args.launcher_exec]
        if args.iface:
            cmd += ["--mca", "oob_tcp_if_include", args.iface,
                    "--mca", "btl_tcp_if_include", args.iface]
    else:  # MPICH hydra passes the whole environment by default
        if hosts:
            cmd += ["-hosts", ",".join(f"{h}:{s}" for h, s in hosts)]
        if args.bind_to_core:
            cmd += ["-bind-to", "core"]
        if args.launcher_exec:
            cmd += ["-launcher", "ssh", "-launcher-exec", args.launcher_exec]
        if args.iface:
            cmd += ["-iface", args.iface]
    return cmd + args.mpi_args + ranks_run


def srun_pmi_option(mpi_args, environ=None):
    """``--mpi=pmi2`` unless the user chose srun's PMI (``--mpi`` in
    --mpi-args, or SLURM_MPI_TYPE, which srun reads): without a PMI plugin
    (Slurm's default MpiDefault=none) every task would start MPI as a world
    of its own. MPICH speaks PMI-1 to Slurm's pmi2 plugin, and so does
    Open MPI 4 built with Slurm's libpmi2."""
    environ = os.environ if environ is None else environ
    if "SLURM_MPI_TYPE" in environ or any(a == "--mpi" or a.startswith("--mpi=")
                                           for a in mpi_args):
        return []
    return ["--mpi=pmi2"]


def interface_address(name):
    """The IPv4 address of network interface ``name``, or None."""
    import fcntl
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def control_address(args, hosts):
    """(address ddlrun listens on, address the agents connect to)."""
    if args.iface:
        address = interface_address(args.iface)
        return address, address
    remote = [h for h, _ in hosts or [] if not is_this_host(h)]
    elsewhere = hosts is None and (args.launcher == "srun" or args.mpi_args or any(
        v in os.environ for v in ALLOCATION_VARIABLES))
    if not remote and not elsewhere:
        return "127.0.0.1", "127.0.0.1"
    if remote:
        try:  # the source address the kernel would use toward that host (sends nothing)
            family, _, _, _, target = socket.getaddrinfo(remote[0], 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(target)
                address = s.getsockname()[0]
            return address, address
        except OSError:
            pass
    return "0.0.0.0", socket.gethostname()


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    try:
        env, hosts, racks, discovery = validate(args)
        if args.dry_run:
            if is_elastic(args):  # the first attempt's command
                plan = elastic_plan(args, env, hosts, racks, discovery)
                env, cmd = plan.env(), plan.command("HOST:PORT")
            else:
                cmd = build_command(args, env, hosts)
            print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(cmd))
            return 0
        if args.max_restarts:
            return run_restarting(args, env, hosts, racks, discovery)
        watch = DeathWatch(*control_address(args, hosts), prefix_output=args.prefix_output,
                           startup=StartupLines(show=args.verbose))
        cmd = build_command(args, env, hosts, agent_address=watch.address)
    except UsageError as e:
        parser.error(str(e))
    child_env = dict(os.environ, **env)
    child_env[TOKEN_VARIABLE] = watch.token
    return run_and_name_first_death(cmd, child_env, watch)


def launcher_shares_terminal():
    """True if a Ctrl-C typed here also reaches the launcher (same
    foreground process group of a terminal)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def run_and_name_first_death(cmd, env, watch):
    """Runs the launcher while ``watch`` relays the output; if the job
    fails, says which rank ended first and where.

    MPICH's launcher reports a dead rank by a PID (not always the first to
    die); Slurm and Open MPI name a task but not why the others stopped."""
    try:
        launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        watch.stop(0)
        sys.stderr.write(f"ddlrun: cannot start {cmd[0]}: {e}\n")
        return 127
    watch.start(launcher.stdout, launcher.stderr)
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        forward = signal.signal(signal.SIGTERM, lambda s, _f: launcher.send_signal(s))
    try:
        try:
            code = launcher.wait()
        except KeyboardInterrupt:
            if not launcher_shares_terminal():  # else Ctrl-C reached the launcher too
                launcher.send_signal(signal.SIGINT)
            try:
                launcher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                launcher.kill()
            code = 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, forward)
        watch.stop()
        launcher.stdout.close()
        launcher.stderr.close()
    first = watch.first_failure()
    if code != 0 and first is not None:
        rank = "a rank of unknown number" if first.rank is None else f"rank {first.rank}"
        sys.stderr.write(f"ddlrun: the job failed (exit code {code}); {rank} on {first.host} "
                         f"ended first ({first.how}), {first.seconds:.1f} s after launch, and "
                         "the launcher then stopped the others\n")
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
