"""ddlrun's host lists: ``-H host[:slots][@rack],...``, a hostfile (ours,
MPICH's, Open MPI's, Horovod's, or the Kubernetes MPI Operator's), and a
host discovery script (horovodrun's contract: an executable that prints one
``host[:slots]`` per line), parsed into ``[(host, slots)]`` and
``{host: rack}``.

Standard library only: ``ddlrun --help`` loads this module.
"""

import os
import re
import socket
import subprocess

HOST_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+(:[1-9][0-9]*)?$")
HOST_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+$")
RACK_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+$")
# A discovery script that has not answered in this time is treated as failed.
DISCOVERY_TIMEOUT_S = 60.0
# How long `ssh HOST true` (or the --launcher-exec program) may take when
# ddlrun checks that it can still start processes on a host.
LAUNCH_CHECK_TIMEOUT_S = 15.0


class UsageError(ValueError):
    """A bad command line or host list: ddlrun prints it as a usage error."""


def parse_hosts(spec, source, default_slots=1):
    """'host[:slots]' items -> [(host, slots)]; a host listed twice is an error."""
    hosts = []
    for item in spec:
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        if not HOST_PATTERN.match(item):
            raise UsageError(f"{source}: '{item}' is not host or host:slots (slots >= 1)")
        name, _, slots = item.partition(":")
        if any(name == h for h, _ in hosts):
            raise UsageError(f"{source}: host '{name}' is listed twice")
        hosts.append((name, int(slots) if slots else default_slots))
    if not hosts:
        raise UsageError(f"{source}: no hosts given")
    return hosts


def hostfile_items(lines, source):
    """A hostfile's lines as -H items, 'host[:slots][@rack]'.

    Every format users bring is read, one host per line, ``#`` starting a
    comment, blank lines skipped:

    - ours and MPICH's / Intel MPI's (Hydra's machinefile): ``host``,
      ``host:slots``, ``host:slots@rack``;
    - Open MPI's and Horovod's: ``host slots=N``, with ``max_slots=M`` (or
      ``max-slots=M``) allowed; ddlrun starts at most ``slots`` ranks on a
      host, which ``max_slots`` must not be below;
    - a rack column on any of them: ``rack=NAME``;
    - the files the Kubernetes MPI Operator (v2beta1) writes: Open MPI's
      form, ``JOB-worker-0.JOB.NAMESPACE.svc slots=N``, or Hydra's for
      MPICH and Intel MPI, ``JOB-worker-0.JOB.NAMESPACE.svc:N``.

    Anything else on a line is a UsageError naming ``source``, the line
    number and the word: a word dropped in silence could change the slots.
    A host listed twice is one too.
    """
    items, first_line = [], {}
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}:{number}"
        item = _hostfile_line(words, where)
        name = item.partition("@")[0].partition(":")[0]
        if name in first_line:
            raise UsageError(f"{where}: host '{name}' is listed twice (first on line "
                             f"{first_line[name]})")
        first_line[name] = number
        items.append(item)
    return items


# A hostfile of 100,000 hosts is a few MB; a file larger than this is not one
# (a device, a log given by mistake) and is refused before it is read.
MAX_HOSTFILE_BYTES = 16 << 20


def read_hostfile(path):
    """--hostfile's lines, or a UsageError naming the file: one that does
    not exist or cannot be read, a file larger than MAX_HOSTFILE_BYTES, a
    NUL byte (a binary file) or bytes that are not UTF-8 (naming the line)."""
    # Before opening: opening a named pipe would wait for a writer.
    if os.path.exists(path) and not os.path.isfile(path):
        raise UsageError(f"--hostfile {path} is not a regular file")
    try:
        with open(path, "rb") as f:
            # As many bytes as the file has (read(n) would allocate n first).
            data = f.read(min(os.fstat(f.fileno()).st_size, MAX_HOSTFILE_BYTES) + 1)
    except OSError as e:
        raise UsageError(f"--hostfile {path} cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_HOSTFILE_BYTES:
        raise UsageError(f"--hostfile {path} is larger than {MAX_HOSTFILE_BYTES} bytes: "
                         "not a hostfile")
    if b"\0" in data:
        line = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise UsageError(f"{path}:{line}: a NUL byte: a hostfile is text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UsageError(f"{path}:{line}: byte 0x{data[e.start]:02x} is not UTF-8 text") from None
    # Lines as a file holds them ("\n", "\r\n"), not str.splitlines' other
    # separators (a form feed in a word stays in it, and is refused there).
    return text.split("\n")


def _whole_at_least_one(text, what, where):
    if not re.fullmatch(r"[1-9][0-9]*", text):
        raise UsageError(f"{where}: {what} '{text}' is not a whole number >= 1")
    return int(text)


def _hostfile_line(words, where):
    """One hostfile line's words -> 'host[:slots][@rack]' (see hostfile_items)."""
    host_part, at, rack = words[0].partition("@")
    name, colon, slots = host_part.partition(":")
    if not HOST_NAME_PATTERN.match(name):
        raise UsageError(f"{where}: '{words[0]}' does not start with a host name (letters, "
                         "digits, '.', '_' or '-')")
    if colon and not re.fullmatch(r"[1-9][0-9]*", slots):
        raise UsageError(f"{where}: '{words[0]}' is not host or host:slots (slots >= 1)")
    max_slots = None
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if eq and key == "slots":
            if slots:
                raise UsageError(f"{where}: the slots are given twice ('{words[0]}' and '{word}')")
            slots = str(_whole_at_least_one(value, "slots=", where))
        elif eq and key in ("max_slots", "max-slots"):
            max_slots = _whole_at_least_one(value, f"{key}=", where)
        elif eq and key == "rack":
            if rack:
                raise UsageError(f"{where}: the rack is given twice ('{words[0]}' and '{word}')")
            rack = value
        else:
            raise UsageError(
                f"{where}: '{word}' is not understood. A hostfile line is 'host', 'host:slots' "
                "(MPICH, Intel MPI) or 'host slots=N' (Open MPI, Horovod), optionally with "
                "max_slots=M and rack=NAME")
    if at or rack:
        if not RACK_PATTERN.match(rack):
            raise UsageError(f"{where}: the rack '{rack}' must be a name of letters, digits, "
                             "'.', '_' or '-'")
    if max_slots is not None and int(slots or 1) > max_slots:
        raise UsageError(f"{where}: slots={slots or 1} is more than max_slots={max_slots}")
    return name + (f":{slots}" if slots else "") + (f"@{rack}" if rack else "")


def split_racks(items, source):
    """'host:slots@rack' items -> (items without racks, {host: rack}).
    Either every host names its rack or none does."""
    plain, racks = [], {}
    for item in items:
        item = item.strip()
        host_part, at, rack = item.partition("@")
        if at:
            if not RACK_PATTERN.match(rack):
                raise UsageError(f"{source}: '{item}': the rack after '@' must be a name of "
                                 "letters, digits, '.', '_' or '-'")
            racks[host_part.partition(":")[0]] = rack
        plain.append(host_part)
    named = [i.partition(":")[0] for i in plain if i and not i.startswith("#")]
    unnamed = [h for h in named if h not in racks]
    if racks and unnamed:
        raise UsageError(f"{source}: hosts {', '.join(unnamed)} name no rack but others do "
                         "(host:slots@rack for every host, or for none)")
    return plain, racks


def topology_env(hosts, racks):
    """DDL_TOPOLOGY for the ranks (docs/topology.md) from {host: rack}, in
    the order the hosts were given; empty without racks."""
    if not racks:
        return {}
    order = []
    for host, _ in hosts:
        if racks[host] not in order:
            order.append(racks[host])
    value = ";".join(f"{rack}=" + ",".join(h for h, _ in hosts if racks[h] == rack)
                     for rack in order)
    return {"DDL_TOPOLOGY": value}


def is_this_host(host):
    name = socket.gethostname()
    return host in ("localhost", "::1", name, name.split(".")[0]) or host.startswith("127.")


def format_hosts(hosts):
    """[(host, slots)] -> 'host:slots,...', as -H takes it."""
    return ",".join(f"{h}:{s}" for h, s in hosts)


class DiscoveryScript:
    """A host discovery script: run with no arguments, it prints the hosts
    available now, one ``host[:slots][@rack]`` per line (``slots``
    defaults to ``slots_per_host``). Horovod's ``--host-discovery-script``
    takes the same scripts.

    Args:
        path: the script; it must be an executable file.
        slots_per_host: slots of a host whose line gives none.
    """

    def __init__(self, path, slots_per_host=1):
        found = path if os.sep in path else None
        if found is None:
            import shutil
            found = shutil.which(path) or (path if os.path.exists(path) else None)
        if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
            raise UsageError(f"--host-discovery-script {path}: not an executable file")
        self.path = os.path.abspath(found)
        self.slots_per_host = slots_per_host

    def run(self):
        """([(host, slots)], {host: rack}) listed now; UsageError if the
        script fails, times out or prints a line that is not a host."""
        source = f"--host-discovery-script {self.path}"
        try:
            proc = subprocess.run([self.path], capture_output=True, text=True,
                                  timeout=DISCOVERY_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise UsageError(f"{source} did not finish in {DISCOVERY_TIMEOUT_S:g} s") from None
        except OSError as e:
            raise UsageError(f"{source} could not run: {e}") from None
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or ["(no output on stderr)"]
            raise UsageError(f"{source} failed with exit code {proc.returncode}: {tail[0]}")
        items, racks = split_racks(hostfile_items(proc.stdout.splitlines(), source), source)
        return parse_hosts(items, source, default_slots=self.slots_per_host), racks


def launch_check(launcher_exec, host, timeout_s=LAUNCH_CHECK_TIMEOUT_S):
    """Why the launcher cannot start a process on ``host``, or None if it
    can: runs ``launcher_exec HOST true`` (ssh in batch mode when no
    --launcher-exec is given), as the MPI launcher would start its proxy."""
    argv = [launcher_exec, host, "true"] if launcher_exec else \
        ["ssh", "-o", "BatchMode=yes", host, "true"]
    shown = " ".join(argv)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"'{shown}' did not finish in {timeout_s:g} s"
    except OSError as e:
        return f"'{shown}' could not run: {e}"
    if proc.returncode == 0:
        return None
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
    return f"'{shown}' failed (exit code {proc.returncode}): {tail[0][:200]}"
