"""`geryon cluster up|check|down` end to end: real sshd in every namespace of an emulated cluster (hosts and the
Linux switch), the cluster command run from host h1 as from a head node, queues really changed and restored."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
COUNTERS = re.compile(r'"direct_packets_stat":\d+,?')


def dump(cluster) -> dict:
    """Configuration of every device of every namespace: tc -j qdiscs and filters, tc -d classes."""
    out = {}
    for ns in [h.netns for h in cluster.hosts] + [s.netns for s in cluster.topology.switches]:
        for what in (["-j", "qdisc", "show"], ["-j", "filter", "show", "dev", "eth0"], ["-d", "class", "show"]):
            if "filter" in what and ns.endswith("-sw"):
                continue
            text = subprocess.run(["tc", "-n", ns, *what], capture_output=True, text=True, check=True).stdout
            out[(ns, " ".join(what))] = COUNTERS.sub("", text)
        if ns.endswith("-sw"):
            for port in ("h1", "h2", "h3"):
                out[(ns, port)] = subprocess.run(["tc", "-n", ns, "-j", "filter", "show", "dev", port],
                                                 capture_output=True, text=True, check=True).stdout
    return out


def geryon_in(cluster, host, *args, state_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "GERYON_STATE_DIR": str(state_dir)}
    return cluster.run(host, [sys.executable, "-m", "geryon", *map(str, args)], timeout=240, cwd=REPO, env=env,
                       capture_output=True, text=True)


@pytest.fixture
def sshd_cluster(unique_name, tmp_path):
    from geryon.emulate import EmulatedCluster
    from geryon.emulate.sshd import access_dir, start_cluster_sshd
    import shutil

    with EmulatedCluster(unique_name, hosts=3, bw="100mbit") as cluster:
        try:
            inventory = start_cluster_sshd(cluster)
            yield cluster, inventory
        finally:
            shutil.rmtree(access_dir(unique_name), ignore_errors=True)


def test_up_check_down_restores_every_queue(sshd_cluster, tmp_path):
    cluster, inventory = sshd_cluster
    inventory.write_text(inventory.read_text().replace('profile = "two-class"', 'profile = "four-class"'))
    before = dump(cluster)
    up = geryon_in(cluster, "h1", "cluster", "up", inventory, "--json", state_dir=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    report = json.loads(up.stdout)
    assert [i["name"] for i in report["items"]] == ["h1", "h2", "h3", "sw"]
    assert all(i["ok"] and i["changed"] for i in report["items"])
    classes = subprocess.run(["tc", "-n", f"gy{cluster.name}-sw", "class", "show", "dev", "h2"],
                             capture_output=True, text=True).stdout
    assert classes.count("class htb") == 5  # 1:1 and four classes: the four-class profile is on the switch
    again = json.loads(geryon_in(cluster, "h1", "cluster", "up", inventory, "--json", state_dir=tmp_path).stdout)
    assert not any(i["changed"] for i in again["items"]) and all("no change" in i["steps"][0] for i in again["items"])

    check = geryon_in(cluster, "h1", "cluster", "check", inventory, "--json", state_dir=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    items = {i["name"]: i for i in json.loads(check.stdout)["items"]}
    assert items["mark high"]["seen_dscps"].keys() == {"46"}
    assert items["mark p1"]["seen_dscps"].keys() == {"34"}
    assert items["queue high"]["ok"] and items["queue low"]["ok"]
    assert items["contention"]["high_share"] >= 0.75

    down = geryon_in(cluster, "h1", "cluster", "down", inventory, state_dir=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert dump(cluster) == before


def test_refusing_host_rolls_back_the_others_and_bad_input_touches_nothing(sshd_cluster, tmp_path):
    cluster, inventory = sshd_cluster
    before = dump(cluster)
    text = inventory.read_text()
    inventory.write_text(text.replace('name = "h3"\naddress = "10.199.0.3"\nnic = "eth0"',
                                      'name = "h3"\naddress = "10.199.0.3"\nnic = "eth9"'))
    up = geryon_in(cluster, "h1", "cluster", "up", inventory, "--json", state_dir=tmp_path)
    assert up.returncode == 1
    report = json.loads(up.stdout)
    items = {i["name"]: i for i in report["items"]}
    assert items["h1"]["rolled_back"] and items["h2"]["rolled_back"]
    assert not items["h3"]["ok"] and "eth9" in items["h3"]["error"]
    assert "sw" not in items
    assert dump(cluster) == before

    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    key = " ".join((tmp_path / "impostor.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"10.199.0.{i} {key}\n" for i in (1, 2, 3)) + f"10.199.255.1 {key}\n")
    inventory.write_text(re.sub(r'known_hosts = ".*"', f'known_hosts = "{known}"', text))
    up = geryon_in(cluster, "h1", "cluster", "up", inventory, state_dir=tmp_path)
    assert up.returncode == 1 and "does not match" in up.stdout and "refusing to connect" in up.stdout

    bad = tmp_path / "bad.toml"
    bad.write_text('[[class]]\nname = "a"\ndscp = [46]\nqueue = 7\nscheduler = "strict"\n'
                   '[[class]]\nname = "b"\ndscp = [46]\nqueue = 0\nweight = 10\n')
    inventory.write_text(text.replace('profile = "two-class"', f'profile = "{bad}"'))
    up = geryon_in(cluster, "h1", "cluster", "up", inventory, state_dir=tmp_path)
    assert up.returncode == 1 and "DSCP 46 is in both class 'a' and class 'b'" in up.stderr
    assert dump(cluster) == before


def test_emulate_up_sshd_writes_an_inventory_that_works(unique_name, tmp_path):
    """`geryon emulate up --sshd` from the command line: sshd everywhere, an inventory, a dry run through it."""
    from geryon.emulate import EmulatedCluster
    from geryon.emulate.sshd import access_dir

    env = {**os.environ}
    up = subprocess.run([sys.executable, "-m", "geryon", "emulate", "up", "--name", unique_name, "--hosts", "2",
                         "--sshd"], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    try:
        assert up.returncode == 0, up.stderr
        inventory = Path(json.loads(up.stdout)["inventory"])
        assert 'address = "10.199.255.1"' in inventory.read_text()
        cluster = EmulatedCluster.from_record(unique_name)
        dry = geryon_in(cluster, "h2", "cluster", "up", inventory, "--dry-run", "--json", state_dir=tmp_path)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        items = json.loads(dry.stdout)["items"]
        assert [i["name"] for i in items] == ["h1", "h2", "sw"]
        assert all(i["steps"][0].startswith("dry run: would change") for i in items)  # filters differ (tc form)
    finally:
        subprocess.run([sys.executable, "-m", "geryon", "emulate", "down", unique_name], capture_output=True,
                       timeout=60, cwd=REPO)
    assert not access_dir(unique_name).exists()
