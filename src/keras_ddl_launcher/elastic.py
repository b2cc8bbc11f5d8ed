"""ddlrun --min-np N --max-np M: restart on the hosts that are left.

Under --max-restarts, with --min-np, --max-np or --host-discovery-script,
each attempt runs on the hosts ddlrun still trusts, filled in order up to
``min(--max-np, their slots)`` ranks. When an attempt fails, ddlrun blames
hosts from what it already knows (``find_blame``):

* the launch failed there: none of the host's ranks said hello, and the
  launcher's own output names the host, or the ranks' start timed out, or
  ddlrun cannot run ``ssh HOST true`` (the --launcher-exec program) there;
* its ranks died: the first rank to end was killed by a signal other than
  a request to stop (SIGTERM, SIGINT, SIGHUP), or vanished without a word;
* the diagnoses name it: every fault diagnosis from the other hosts' ranks
  names all of its ranks unreachable, and nothing was heard from them
  since (or, with at least two other hosts, their own diagnoses name every
  other rank unreachable: the host is cut off, not the rest).

A rank that ends with an exit code of its own (an exception, a keras_ddl
diagnosis) blames no host: that is the program's failure or a fault seen
from elsewhere. Blamed hosts are left out of the next attempts; if the
slots left reach --min-np, the job relaunches at once on them, else ddlrun
gives up. With a discovery script, ddlrun runs it again before every
relaunch: hosts it lists for the first time join, hosts it stops listing
leave, and a blamed host rejoins once the script has stopped listing it
and lists it again (it was replaced or repaired). The job is never
interrupted to add a host. Each decision is one line: the host, why, the
new world size and the time lost so far.
"""

import re
import socket

from .deathwatch import LOST
from .hosts import UsageError, format_hosts, is_this_host, topology_env
from .restart import peer_states, say

# How long the ranks of an attempt have to say hello before ddlrun ends the
# attempt and blames the hosts none of whose ranks did.
START_TIMEOUT_S = 60.0
# Signals that ask a process to stop: a rank ended by one blames no host.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


def placement(hosts):
    """{rank: host} as the launcher fills [(host, slots)] in order."""
    ranks, rank = {}, 0
    for host, slots in hosts:
        for _ in range(slots):
            ranks[rank] = host
            rank += 1
    return ranks


def host_of_ranks(hosts, hello):
    """{rank: host of ``hosts``}: the host whose name matches the one the
    rank's agent reported (``hello``: {rank: hostname}), else where the
    launcher's fill order puts it."""
    aliases = {}
    for host, _ in hosts:
        names = {host, host.split(".")[0]}
        if is_this_host(host):
            names |= {socket.gethostname(), socket.gethostname().split(".")[0]}
        for name in names:
            aliases.setdefault(name, host)
    placed = placement(hosts)
    found = {}
    for rank, host in placed.items():
        said = hello.get(rank) or ""
        found[rank] = aliases.get(said) or aliases.get(said.split(".")[0]) or host
    return found


def died(how):
    """True if a rank that ended this way counts against its host."""
    if how == LOST:
        return True
    return how.startswith("killed by") and not how.endswith(STOP_SIGNALS)


def _span(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _line_naming(text, host):
    """The first line of ``text`` that names ``host`` as a word, or None."""
    word = re.compile(r"(?<![A-Za-z0-9_.\-])" + re.escape(host) + r"(?![A-Za-z0-9_\-])")
    return next((line.strip() for line in text.splitlines() if word.search(line)), None)


def find_blame(hosts, attempt, start_timeout_s=START_TIMEOUT_S, can_launch=None):
    """[(host, why)]: the hosts of ``hosts`` ([(host, slots)] the attempt
    ran on) to leave out after the failed ``attempt`` (restart.Attempt).
    ``can_launch(host)``: why processes cannot be started there, or None
    (hosts.launch_check), asked of hosts none of whose ranks started when
    nothing else tells why (the launcher may exit before it prints the
    error of the host it could not reach)."""
    watch = attempt.watch
    if watch is None:
        return []
    host_of = host_of_ranks(hosts, watch.ranks)
    ranks_on = {h: sorted(r for r, on in host_of.items() if on == h) for h, _ in hosts}
    blamed = {}
    launcher_text = watch.launcher_text.decode(errors="replace")
    for host, ranks in ranks_on.items():
        if not ranks or any(r in watch.ranks for r in ranks):
            continue
        said = _line_naming(launcher_text, host)
        failed = f"the launch failed there: its {_span(ranks)} never started"
        if attempt.start_timed_out:
            blamed[host] = (f"the launch failed there: its {_span(ranks)} did not start within "
                            f"{start_timeout_s:g} s")
        elif said is not None:
            blamed[host] = f"{failed} (the launcher said: {said[:200]})"
        elif can_launch is not None:
            why = can_launch(host)
            if why is not None:
                blamed[host] = f"{failed}, and {why}"
    first = attempt.failure
    if not blamed and first is not None and first.rank in host_of and died(first.how):
        blamed[host_of[first.rank]] = (f"its rank {first.rank} was the first to end "
                                       f"({first.how})")
    heard = {d.rank for d in watch.deaths if d.how != LOST} | set(watch.fault_lines)
    states = {r: peer_states(line) for r, line in watch.fault_lines.items()}
    for host, ranks in ranks_on.items():
        if host in blamed or not ranks:
            continue
        outside = [s for r, s in states.items() if host_of.get(r) != host]
        if not outside or not all(all(s.get(r) == "unreachable" for r in ranks)
                                  for s in outside):
            continue
        named = (f"every fault diagnosis from the other hosts' ranks ({len(outside)}) names its "
                 f"{_span(ranks)} unreachable")
        if not heard & set(ranks):
            blamed[host] = named + ", and none of them was heard from after the fault"
            continue
        others = [r for r, on in host_of.items() if on != host]
        mine = [s for r, s in states.items() if host_of.get(r) == host]
        if len({host_of[r] for r in others}) >= 2 and mine and \
                all(all(s.get(r) == "unreachable" for r in others) for s in mine):
            blamed[host] = named + ", and its own ranks name every other rank unreachable: " \
                                   "it is cut off from the others"
    return [(h, blamed[h]) for h, _ in hosts if h in blamed]


class HostPool:
    """The hosts an elastic job may run on, in the order ranks are placed
    (hosts keep their place; new ones go last, so rank 0 stays where it
    was while its host stays), their slots, their racks, and the hosts left
    out with why.

    Args:
        hosts: [(host, slots)] from -H, --hostfile or the discovery script.
        racks: {host: rack}, or empty.
        min_np, max_np: the bounds of the world size.
        discovery: a hosts.DiscoveryScript, or None for a fixed list.
    """

    def __init__(self, hosts, racks, min_np, max_np, discovery=None):
        self.order = [h for h, _ in hosts]
        self.slots = dict(hosts)
        self.racks = dict(racks)
        self.min_np = min_np
        self.max_np = max_np
        self.discovery = discovery
        self.out = {}         # host -> why it is left out
        self.unlisted = set()  # left-out hosts the discovery script stopped listing

    def usable(self):
        """[(host, slots)] of the hosts not left out, in order."""
        return [(h, self.slots[h]) for h in self.order if h not in self.out]

    def capacity(self):
        return sum(s for _, s in self.usable())

    def size(self):
        """The world size of the next attempt: as many ranks as the usable
        slots hold, at most --max-np."""
        return min(self.max_np, self.capacity())

    def fill(self, size):
        """[(host, slots used)] for ``size`` ranks, filling hosts in order."""
        hosts, left = [], size
        for host, slots in self.usable():
            if left <= 0:
                break
            hosts.append((host, min(slots, left)))
            left -= hosts[-1][1]
        return hosts

    def leave_out(self, host, why):
        self.out[host] = why

    def rediscover(self):
        """Runs the discovery script; returns [(host, event, why)] for the
        hosts that join, leave or rejoin (event: "joins", "leaves",
        "rejoins"), or raises UsageError if the script failed."""
        listed, racks = self.discovery.run()
        names = [h for h, _ in listed]
        events = []
        for host in self.order:
            if host in names:
                continue
            if host in self.out:
                self.unlisted.add(host)
            else:
                events.append((host, "leaves", "the discovery script no longer lists it"))
        for host, slots in listed:
            if host in self.out and host in self.unlisted:
                del self.out[host]
                self.unlisted.discard(host)
                events.append((host, "rejoins", "the discovery script lists it again after "
                                                "it had been left out and unlisted"))
            elif host not in self.order:
                events.append((host, "joins", "the discovery script lists it"))
        self.order = [h for h in self.order if h in names] + \
            [h for h in names if h not in self.order]
        self.slots = dict(listed)
        self.racks = dict(racks)
        return events


class ElasticPlan:
    """Where each attempt of an elastic job runs, and what ddlrun decides
    after a failed one (restart.run_with_restarts calls it).

    Args:
        pool: the HostPool.
        command_for: (hosts, size, agent address) -> the launcher's command.
        env: the DDL_* settings every attempt gets (DDL_TOPOLOGY is made
            per attempt from the pool's racks).
        start_timeout_s: how long ranks have to start (say hello).
        can_launch: host -> why processes cannot be started there, or None
            (find_blame).
    """

    elastic = True

    def __init__(self, pool, command_for, env, start_timeout_s=START_TIMEOUT_S,
                 can_launch=None):
        self.pool = pool
        self.can_launch = can_launch
        self._command_for = command_for
        self._env = dict(env)
        self.start_timeout_s = start_timeout_s
        self.min_np = pool.min_np
        self.world_size = pool.size()
        self.hosts = pool.fill(self.world_size)

    def command(self, agent_address):
        return self._command_for(self.hosts, self.world_size, agent_address)

    def env(self):
        env = {k: v for k, v in self._env.items() if k != "DDL_TOPOLOGY"}
        env.update(topology_env(self.hosts, self.pool.racks))
        return env

    def after_failure(self, attempt, restart, time_lost):
        """Leaves out the hosts to blame, asks the discovery script again,
        sets the next attempt's hosts and says each decision in one line;
        returns whether enough slots are left to go on."""
        blamed = find_blame(self.hosts, attempt, self.start_timeout_s, self.can_launch)
        for host, why in blamed:
            self.pool.leave_out(host, why)
        changes = []
        if self.pool.discovery is not None:
            try:
                changes = self.pool.rediscover()
            except UsageError as e:
                say(f"the discovery script failed before restart {restart}: {e}; that restart "
                    "uses the hosts it listed before")
        was = self.world_size
        size = self.pool.size()
        go_on = size >= self.pool.min_np
        if go_on:
            self.world_size, self.hosts = size, self.pool.fill(size)
            outcome = (f"the job goes on with {size} rank(s) on {format_hosts(self.hosts)} "
                       f"(was {was})")
        else:
            outcome = (f"{self.pool.capacity()} slot(s) remain, fewer than --min-np "
                       f"{self.pool.min_np}")
        for host, why in blamed:
            say(f"{host} is left out of the next attempts: {why}; {outcome}; time lost so far: "
                f"{time_lost}")
        for host, event, why in changes:
            if event == "joins":
                say(f"{host} joins at restart {restart}: {why}; {outcome}; time lost so far: "
                    f"{time_lost}")
            elif event == "rejoins":
                say(f"{host} rejoins at restart {restart}: {why}; {outcome}; time lost so far: "
                    f"{time_lost}")
            else:
                say(f"{host} leaves at restart {restart}: {why}; {outcome}; time lost so far: "
                    f"{time_lost}")
        return go_on
