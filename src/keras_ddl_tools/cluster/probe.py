"""Is the test cluster faithful at these rates? Plain TCP transfers between
its nodes, every node busy at once, measured by the receivers and by the
links' byte counters, against the shaped rates.

Two phases, each with every node sending and receiving:

- ``rack``: inside every rack, node i sends to node i+1 (a ring), so every
  node link carries one stream each way; each should reach the node rate.
- ``uplink``: node i of rack r sends to node i of rack r+1, so each uplink
  carries the rack's N streams each way; together they should reach the
  uplink rate (with one rack this phase is skipped).

A stream's rate is taken from the receiver's bytes between 1 s after its
first byte and the end of its 3 s window (the token bucket's first burst
leaves faster than the rate); the link counters over one 2 s window common
to all streams inside that. Counters count Ethernet frames (headers
included), receivers TCP payload, so a link at its rate shows slightly
above 1 in the counters and about 0.95 in the receivers.

    python -m keras_ddl.cluster probe --racks 2 --nodes 4 --rate 1gbit --uplink 250mbit
"""

import json
import subprocess
import sys
import time

from .netns import NetnsCluster

PORT = 5201

RECEIVER = r"""
import socket, sys, time
warm, window = float(sys.argv[1]), float(sys.argv[2])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", %d)); srv.listen(1); print("ready", flush=True)
conn, _ = srv.accept()
buf = bytearray(1 << 20); view = memoryview(buf)
first = None; counted = 0; start = None
while True:
    n = conn.recv_into(view)
    if n == 0: break
    now = time.monotonic()
    if first is None: first = now
    if now - first >= warm:
        if start is None: start = now
        else: counted += n
        if now - start >= window: break
print(counted / (time.monotonic() - start), flush=True)
""" % PORT

SENDER = r"""
import socket, sys, time
host, seconds = sys.argv[1], float(sys.argv[2])
s = socket.create_connection((host, %d))
data = bytes(1 << 20); end = time.monotonic() + seconds
try:
    while time.monotonic() < end: s.sendall(data)
except OSError:
    pass
""" % PORT


def _in(cluster, node, code, *args):
    return subprocess.Popen(["ip", "netns", "exec", cluster.namespaces[node], sys.executable,
                             "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True)


def run_phase(cluster, pairs, warm=1.0, window=3.0):
    """Streams (src, dst) all at once; returns each one's received bytes/s
    and the link and uplink counters' rates (bytes/s) over one window
    common to all streams: from 1.5 s after the senders start (past the
    buckets' first bursts) to 0.5 s before the receivers stop counting."""
    receivers = [_in(cluster, dst, RECEIVER, warm, window) for _, dst in pairs]
    for r in receivers:
        assert r.stdout.readline().strip() == "ready"
    senders = [_in(cluster, src, SENDER, cluster.addresses[dst], warm + window + 2)
               for src, dst in pairs]
    time.sleep(warm + 0.5)
    links0, up0, t0 = cluster.link_bytes(), cluster.uplink_bytes(), time.monotonic()
    time.sleep(window - 1.0)
    links1, up1, t1 = cluster.link_bytes(), cluster.uplink_bytes(), time.monotonic()
    rates = [float(r.communicate()[0].strip()) for r in receivers]
    for s in senders:
        s.kill()
        s.wait()
    seconds = t1 - t0
    links = [((s1 - s0) / seconds, (r1 - r0) / seconds)
             for (s0, r0), (s1, r1) in zip(links0, links1)]
    uplinks = [((o1 - o0) / seconds, (i1 - i0) / seconds)
               for (o0, i0), (o1, i1) in zip(up0, up1)]
    return rates, links, uplinks


def probe(cluster):
    """{'rack': [...], 'uplink': [...]}: per stream or per uplink, the rate
    reached as a fraction of the shaped rate."""
    n, racks = cluster.nodes_per_rack, cluster.racks
    node = lambda r, i: r * n + i  # noqa: E731
    result = {}
    if n > 1:
        pairs = [(node(r, i), node(r, (i + 1) % n)) for r in range(racks) for i in range(n)]
        rates, links, _ = run_phase(cluster, pairs)
        result["rack"] = {
            "streams": [{"from": cluster.hosts[s], "to": cluster.hosts[d],
                         "of_rate": rate * 8 / cluster.rate_bps}
                        for (s, d), rate in zip(pairs, rates)],
            "link_counters_of_rate": [sent * 8 / cluster.rate_bps for sent, _ in links]}
    if racks > 1:
        pairs = [(node(r, i), node((r + 1) % racks, i)) for r in range(racks) for i in range(n)]
        rates, _, uplinks = run_phase(cluster, pairs)
        per_rack = [sum(rate for (s, _), rate in zip(pairs, rates) if s // n == r)
                    for r in range(racks)]
        result["uplink"] = {
            "racks": [{"rack": r + 1, "streams": n, "of_uplink": total * 8 / cluster.uplink_bps}
                      for r, total in enumerate(per_rack)],
            "uplink_counters_of_rate": [out * 8 / cluster.uplink_bps for out, _ in uplinks]}
    return result


def main(args):
    with NetnsCluster(args.nodes, args.rate, burst=args.burst, racks=args.racks,
                      uplink=args.uplink) as cluster:
        result = probe(cluster)
    print(f"cluster: {args.racks} rack(s) x {args.nodes} node(s), links {args.rate}, "
          f"uplinks {args.uplink or args.rate}; every node sending and receiving at once")
    if "rack" in result:
        worst = min(s["of_rate"] for s in result["rack"]["streams"])
        print(f"inside racks: {len(result['rack']['streams'])} streams, slowest at "
              f"{worst:.3f} of the link rate; link counters "
              + " ".join(f"{x:.3f}" for x in result["rack"]["link_counters_of_rate"]))
    if "uplink" in result:
        print("across racks: " + ", ".join(
            f"rack{r['rack']} {r['streams']} streams at {r['of_uplink']:.3f} of the uplink"
            for r in result["uplink"]["racks"]) + "; uplink counters " +
            " ".join(f"{x:.3f}" for x in result["uplink"]["uplink_counters_of_rate"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"racks": args.racks, "nodes_per_rack": args.nodes, "rate": args.rate,
                       "uplink": args.uplink or args.rate, **result}, f, indent=2)
    return 0
