"""The test cluster's link shaping: the token bucket (--burst) reaches tc on
both ends of every link, and bad values are refused by name."""

import subprocess
import sys

import pytest

from keras_ddl_tools.cluster import ClusterError, NetnsCluster, parse_burst


@pytest.mark.parametrize("text, expected", [("64k", 65536), ("256KB", 262144), ("1mb", 1 << 20),
                                            ("100000", 100000), ("2.5k", 2560)])
def test_burst_sizes(text, expected):
    assert parse_burst(text, 1e9) == expected


def test_default_burst_is_2ms_at_the_rate_and_at_least_256k():
    assert parse_burst(None, 1e9) == 256 * 1024  # 2 ms at 1 Gbit/s is 250,000 bytes
    assert parse_burst(None, 10e9) == 2_500_000
    assert NetnsCluster(2, "100mbit").burst == 256 * 1024


@pytest.mark.parametrize("text", ["0", "-64k", "lots", "64q", "1000", "1.5"])
def test_bad_burst_is_refused_naming_it(text):
    with pytest.raises(ClusterError, match=r"burst='" + text.replace(".", r"\.")):
        NetnsCluster(2, "1gbit", burst=text)


@pytest.mark.usefixtures("needs_netns")
def test_burst_reaches_both_ends_of_every_link():
    with NetnsCluster(2, "100mbit", burst="16k") as cluster:
        for ns, veth in zip(cluster.namespaces, cluster.host_veths):
            outside = subprocess.run(["tc", "qdisc", "show", "dev", veth], capture_output=True,
                                     text=True, check=True).stdout
            inside = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev",
                                     "eth0"], capture_output=True, text=True, check=True).stdout
            for shown in (outside, inside):
                assert "tbf" in shown and "rate 100Mbit" in shown, shown
                assert "burst 16Kb" in shown, shown


def _send(cluster, src, dst, nbytes):
    """nbytes over TCP from node src to node dst (0-based), inside their
    namespaces."""
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", cluster.namespaces[dst], sys.executable, "-c",
         "import socket; s = socket.socket(); s.bind(('0.0.0.0', 5202)); s.listen(1); "
         "print('ready', flush=True); c, _ = s.accept(); n = 0\n"
         "while True:\n  b = c.recv(65536)\n  if not b: break\n  n += len(b)\n"
         "print(n)"], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout.readline().strip() == "ready"
    subprocess.run(["ip", "netns", "exec", cluster.namespaces[src], sys.executable, "-c",
                    f"import socket; socket.create_connection(('{cluster.addresses[dst]}', 5202))"
                    f".sendall(bytes({nbytes}))"], check=True)
    assert int(receiver.communicate(timeout=30)[0]) == nbytes


@pytest.mark.usefixtures("needs_netns")
def test_racks_bridges_uplinks_and_slurm_topology():
    """2 racks x 2 nodes: nodes of different racks reach each other only
    through the uplinks (their counters grow by what crossed), each uplink
    is shaped on both ends at its own rate, every node is told its place
    as Slurm's tree topology would, and nothing is left after teardown."""
    with NetnsCluster(2, "200mbit", racks=2, uplink="50mbit") as cluster:
        name = cluster.name
        assert cluster.nodes == 4 and cluster.rack_of == [0, 0, 1, 1]
        for rack_side, core_side in cluster.uplinks:
            for dev in (rack_side, core_side):
                shown = subprocess.run(["tc", "qdisc", "show", "dev", dev], capture_output=True,
                                       text=True, check=True).stdout
                assert "tbf" in shown and "rate 50Mbit" in shown, shown
        for veth in cluster.host_veths:
            shown = subprocess.run(["tc", "qdisc", "show", "dev", veth], capture_output=True,
                                   text=True, check=True).stdout
            assert "rate 200Mbit" in shown, shown
        # node1 (rack 1) -> node3 (rack 2) crosses both uplinks; node1 ->
        # node2 (same rack) crosses none.
        before = cluster.uplink_bytes()
        _send(cluster, 0, 2, 200_000)
        middle = cluster.uplink_bytes()
        _send(cluster, 0, 1, 200_000)
        after = cluster.uplink_bytes()
        assert middle[0][0] - before[0][0] >= 200_000 <= middle[1][1] - before[1][1], \
            (before, middle)
        assert after[0][0] - middle[0][0] < 20_000, (middle, after)  # ARP, ACKs at most
        for i, host in enumerate(cluster.hosts):
            out = subprocess.run([cluster.standin, host, "echo", "$(hostname)",
                                  "$SLURM_TOPOLOGY_ADDR", "$SLURM_TOPOLOGY_ADDR_PATTERN"],
                                 capture_output=True, text=True, check=True).stdout.split()
            assert out == [host, f"core.rack{i // 2 + 1}.{host}", "switch.switch.node"], out
        assert cluster.ddl_topology() == "rack1=node1,node2;rack2=node3,node4"
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert name not in links
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in namespaces
