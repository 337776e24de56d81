"""Where `geryon cluster` may dial: the guard against emulated addresses and the namespace an emulated
inventory dials from, read from real state records and inventories (no cluster, no connection made)."""

import json

import pytest

from geryon import envvars
from geryon.cluster.emulated import refuse_emulated_addresses, running_subnets
from geryon.cluster.inventory import load_inventory
from geryon.errors import InventoryError, RemoteError
from geryon.netconf.remote import connect_in_netns

INVENTORY = """[defaults]
{emulated}user = "root"
known_hosts = "known_hosts"

[[host]]
name = "h1"
address = "{first}"
nic = "eth0"

[[host]]
name = "h2"
address = "10.0.0.12"
nic = "eth0"
"""


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A state directory of its own, holding the record of a cluster `zz1` on 10.198.0.0/16."""
    monkeypatch.setenv(envvars.STATE_DIR, str(tmp_path / "state"))
    folder = tmp_path / "state" / "clusters"
    folder.mkdir(parents=True)
    (folder / "zz1.json").write_text(json.dumps({"name": "zz1", "state": "up", "subnet": "10.198.0.0/16"}))
    return folder


def test_an_address_in_a_running_clusters_subnet_is_refused_and_others_pass(records):
    assert running_subnets()["zz1"].with_prefixlen == "10.198.0.0/16"
    with pytest.raises(InventoryError, match=r"h1 at 10\.198\.3\.4 is in 10\.198\.0\.0/16, .*\(.*zz1.*\), but the "
                                             r"inventory names none of them"):
        refuse_emulated_addresses("lab.toml", [("h0", "10.0.0.11"), ("h1", "10.198.3.4")])
    refuse_emulated_addresses("lab.toml", [("h0", "10.0.0.11"), ("h1", "10.197.3.4"), ("h2", "2001:db8::1")])


def test_an_inventory_naming_no_cluster_is_refused_before_any_host_is_contacted(records, tmp_path):
    path = tmp_path / "lab.toml"
    path.write_text(INVENTORY.format(emulated="", first="10.198.0.1"))
    with pytest.raises(InventoryError, match='add emulated = "NAME"'):
        load_inventory(path)
    path.write_text(INVENTORY.format(emulated="", first="10.0.0.11"))
    assert all(h.endpoint.netns is None for h in load_inventory(path).hosts)


def test_the_emulated_key_must_name_a_cluster(records, tmp_path):
    path = tmp_path / "lab.toml"
    path.write_text(INVENTORY.format(emulated="emulated = 7\n", first="10.198.0.1"))
    with pytest.raises(InventoryError, match="must be the emulated cluster's name"):
        load_inventory(path)
    path.write_text(INVENTORY.format(emulated='emulated = "../x"\n', first="10.198.0.1"))
    with pytest.raises(InventoryError, match="bad cluster name"):
        load_inventory(path)


def test_dialing_from_a_namespace_that_does_not_exist_fails_without_dialing():
    with pytest.raises(RemoteError, match="network namespace gyzz9-h1 does not exist"):
        connect_in_netns("10.198.0.1", 22, "gyzz9-h1", timeout=1)
