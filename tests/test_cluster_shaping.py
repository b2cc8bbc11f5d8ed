"""The test cluster's link shaping: the token bucket (--burst) reaches tc on
both ends of every link, and bad values are refused by name."""

import subprocess

import pytest

from keras_ddl.cluster import ClusterError, NetnsCluster, missing_requirements, parse_burst


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


def test_burst_reaches_both_ends_of_every_link():
    reason = missing_requirements()
    if reason:
        pytest.skip(f"the network-namespace test cluster needs root, ip and tc: {reason}")
    with NetnsCluster(2, "100mbit", burst="16k") as cluster:
        for ns, veth in zip(cluster.namespaces, cluster.host_veths):
            outside = subprocess.run(["tc", "qdisc", "show", "dev", veth], capture_output=True,
                                     text=True, check=True).stdout
            inside = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev",
                                     "eth0"], capture_output=True, text=True, check=True).stdout
            for shown in (outside, inside):
                assert "tbf" in shown and "rate 100Mbit" in shown, shown
                assert "burst 16Kb" in shown, shown
