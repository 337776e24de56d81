"""Topologies as plain data: names, addresses, links, rates and validation (no root needed)."""

import pytest

from geryon.emulate.topology import build_topology, check_name, default_uplink_fraction, leafspine, star
from geryon.errors import ConfigError, RateError


def test_star_names_addresses_and_links():
    topo = star("demo", 3, "100mbit")
    assert [h.netns for h in topo.hosts] == ["gydemo-h1", "gydemo-h2", "gydemo-h3"]
    assert [h.ip for h in topo.hosts] == ["10.199.0.1", "10.199.0.2", "10.199.0.3"]
    assert [s.netns for s in topo.switches] == ["gydemo-sw"]
    assert len(topo.links) == 3 and all(link.rate == 100_000_000 for link in topo.links)
    port = topo.switch_port("h2")
    assert (port.netns, port.dev, port.bridged) == ("gydemo-sw", "h2", True)
    assert all(link.a.dev == "eth0" and not link.a.bridged for link in topo.links)


def test_leafspine_splits_hosts_and_oversubscribes_uplinks():
    topo = leafspine("ls", 6, "100mbit")
    assert [s.netns for s in topo.switches] == ["gyls-l1", "gyls-l2", "gyls-sp"]
    on_l1 = [h.name for h in topo.hosts if h.switch == "l1"]
    assert on_l1 == ["h1", "h3", "h5"]
    uplinks = [link for link in topo.links if link.b.netns == "gyls-sp"]
    assert len(uplinks) == 2
    # half of the hosts (one leaf) offer more than the uplink carries
    assert 3 * topo.rate > topo.uplink_rate == uplinks[0].rate == 150_000_000
    assert topo.switch_port("h2").netns == "gyls-l2"


def test_leafspine_uplink_fraction_is_configurable():
    topo = leafspine("ls", 4, "1gbit", uplink_fraction=0.25)
    assert topo.uplink_rate == 250_000_000
    assert default_uplink_fraction(2) == 0.5  # even 1 host per leaf exceeds its uplink


def test_interface_names_fit_the_kernel_limit():
    topo = leafspine("abcdef", 64, "10mbit")
    for link in topo.links:
        for end in (link.a, link.b):
            assert len(end.dev) <= 15 and len(end.netns) <= 15


@pytest.mark.parametrize("name", ["", "Demo", "toolong7", "a-b", "a b", None, "ü"])
def test_bad_names_are_rejected(name):
    with pytest.raises(ConfigError, match="bad cluster name"):
        check_name(name)


@pytest.mark.parametrize("hosts", [0, 1, 65, "3", 2.5, True])
def test_bad_host_counts_are_rejected(hosts):
    with pytest.raises(ConfigError, match="host count"):
        star("demo", hosts, "100mbit")


def test_bad_rate_and_topology():
    with pytest.raises(RateError):
        star("demo", 3, "100 furlongs")
    with pytest.raises(ConfigError, match="unknown topology"):
        build_topology("ring", "demo", 3, "100mbit")
    with pytest.raises(ConfigError, match="only applies"):
        build_topology("star", "demo", 3, "100mbit", uplink_fraction=0.5)
    with pytest.raises(ConfigError, match="uplink fraction"):
        leafspine("demo", 4, "100mbit", uplink_fraction=0)
