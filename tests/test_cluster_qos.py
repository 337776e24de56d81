"""`geryon cluster up|check|down` end to end, run as the README shows it: `geryon emulate up --sshd`, then the
cluster commands from the machine's own shell (this test's root namespace), against real sshd in every
namespace of the emulated cluster (hosts and the Linux switch); queues really changed and restored, and not
one packet to an emulated address leaving by the machine's own interfaces (tcpdump on each of them)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
COUNTERS = re.compile(r'"direct_packets_stat":\d+,?')
EMULATED_NET = "net 10.199.0.0/16"


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


def geryon(*args, state_dir=None, timeout=240) -> subprocess.CompletedProcess:
    """`geryon ARGS` as a user types it, from this process's (the root) namespace."""
    script = Path(sys.executable).with_name("geryon")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "geryon"]
    env = {**os.environ, **({"GERYON_STATE_DIR": str(state_dir)} if state_dir else {})}
    return subprocess.run([*argv, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env)


class Capture:
    """tcpdump on one interface (of the root namespace, or of `netns`) with a filter; `stop` returns the
    packets it saw, one line each, and sets `dropped` (matching packets the kernel could not hand it)."""

    def __init__(self, iface: str, netns: str | None = None, bpf: str = EMULATED_NET):
        self.where = f"{netns or 'root'}:{iface}"
        # packets go to a file (read back in `stop`): a SIGINT that lands while tcpdump writes to a pipe
        # ends it with "Unable to write output: Interrupted system call" and no summary
        self.file = tempfile.NamedTemporaryFile(prefix="gy-capture-", suffix=".pcap", delete=False).name
        argv = ["tcpdump", "-i", iface, "-n", "-U", "--immediate-mode", "-w", self.file, bpf]
        self.proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", "--", *argv] if netns else argv,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        for line in self.proc.stderr:  # "listening on IFACE, ..." once it captures
            if "listening on" in line:
                break
            if time.monotonic() > deadline:
                break
        else:
            self.stop()
            raise AssertionError(f"tcpdump on {self.where} did not start")

    def stop(self) -> list[str]:
        if self.proc.poll() is None:
            time.sleep(0.5)  # packets in flight reach the capture before it ends
            self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=10)
        try:
            dropped = re.search(r"(\d+) packets dropped by kernel", err)
            assert dropped, f"tcpdump on {self.where} gave no summary: {err}"
            self.dropped = int(dropped.group(1))
            read = subprocess.run(["tcpdump", "-n", "-r", self.file], capture_output=True, text=True, timeout=30)
            assert read.returncode == 0, read.stderr
        finally:
            os.unlink(self.file)
        return [line for line in read.stdout.splitlines() if line.strip()]


def root_interfaces() -> list[str]:
    """The machine's own interfaces that are up (a down one sends nothing): every one but lo and geryon's gy*."""
    names = []
    for name in sorted(os.listdir("/sys/class/net")):
        if name == "lo" or name.startswith("gy"):
            continue
        if int(Path(f"/sys/class/net/{name}/flags").read_text(), 16) & 0x1:  # IFF_UP
            names.append(name)
    return names


@pytest.fixture
def nothing_leaves():
    """Captures on every up interface of the root namespace; after the test, each must have seen no packet
    to or from 10.199.0.0/16."""
    captures = []
    try:
        for iface in root_interfaces():
            captures.append(Capture(iface))
        assert captures, "no interface of the root namespace is up: nothing to watch"
        yield
    finally:
        seen = {c.where: c.stop() for c in captures}
    assert not any(c.dropped for c in captures), f"a capture missed packets: {[(c.where, c.dropped) for c in captures]}"
    leaked = {where: lines for where, lines in seen.items() if lines}
    assert not leaked, f"packets to an emulated address left by the machine's own interfaces: {leaked}"


@pytest.fixture(scope="module")
def host_cluster():
    """`geryon emulate up --name X --hosts 3 --sshd` from the root namespace, shared by this module's tests;
    `geryon emulate down X` after them. Yields the cluster, its inventory and the inventory's text."""
    from geryon.emulate import EmulatedCluster
    from geryon.emulate.clean import clean
    from geryon.emulate.sshd import access_dir

    name = "t" + uuid.uuid4().hex[:5]
    up = geryon("emulate", "up", "--name", name, "--hosts", "3", "--sshd", timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        inventory = Path(json.loads(up.stdout)["inventory"])
        yield EmulatedCluster.from_record(name), inventory, inventory.read_text()
    finally:
        down = geryon("emulate", "down", name, timeout=60)
        clean(name=name)
        shutil.rmtree(access_dir(name), ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert not access_dir(name).exists()


@pytest.fixture
def sshd_cluster(host_cluster):
    """The shared cluster with its inventory as `emulate up --sshd` wrote it (a test may edit it)."""
    cluster, inventory, text = host_cluster
    inventory.write_text(text)
    yield cluster, inventory
    inventory.write_text(text)


@pytest.mark.timing
def test_up_check_down_from_the_host_shell_restores_every_queue(sshd_cluster, tmp_path, nothing_leaves):
    cluster, inventory = sshd_cluster
    assert f'emulated = "{cluster.name}"' in inventory.read_text()
    assert 'address = "10.199.255.1"' in inventory.read_text()
    inventory.write_text(inventory.read_text().replace('profile = "two-class"', 'profile = "four-class"'))
    before = dump(cluster)
    # the switch port toward h2 carries the cluster's own traffic: the same capture sees it there
    inside = Capture("h2", netns=f"gy{cluster.name}-sw", bpf=f"{EMULATED_NET} and tcp port 22")
    try:
        dry = geryon("cluster", "up", inventory, "--dry-run", "--json", state_dir=tmp_path)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        items = json.loads(dry.stdout)["items"]
        assert [i["name"] for i in items] == ["h1", "h2", "h3", "sw"]
        assert all(i["steps"][0].startswith("dry run: would change") for i in items)
        assert dump(cluster) == before

        up = geryon("cluster", "up", inventory, "--json", state_dir=tmp_path)
        assert up.returncode == 0, up.stdout + up.stderr
        report = json.loads(up.stdout)
        assert [i["name"] for i in report["items"]] == ["h1", "h2", "h3", "sw"]
        assert all(i["ok"] and i["changed"] for i in report["items"])
        classes = subprocess.run(["tc", "-n", f"gy{cluster.name}-sw", "class", "show", "dev", "h2"],
                                 capture_output=True, text=True).stdout
        assert classes.count("class htb") == 5  # 1:1 and four classes: the four-class profile is on the switch
        again = json.loads(geryon("cluster", "up", inventory, "--json", state_dir=tmp_path).stdout)
        assert not any(i["changed"] for i in again["items"])
        assert all("no change" in i["steps"][0] for i in again["items"])

        check = geryon("cluster", "check", inventory, "--json", state_dir=tmp_path)
        assert check.returncode == 0, check.stdout + check.stderr
        items = {i["name"]: i for i in json.loads(check.stdout)["items"]}
        assert items["mark high"]["seen_dscps"].keys() == {"46"}
        assert items["mark p1"]["seen_dscps"].keys() == {"34"}
        assert items["queue high"]["ok"] and items["queue low"]["ok"]
        assert items["contention"]["high_share"] >= 0.75

        down = geryon("cluster", "down", inventory, state_dir=tmp_path)
        assert down.returncode == 0, down.stdout + down.stderr
        assert dump(cluster) == before
    finally:
        seen_inside = inside.stop()
    ssh_to_h2 = [line for line in seen_inside if "10.199.0.2.22 >" in line]
    assert ssh_to_h2, "the capture saw no SSH traffic from h2 inside the cluster: it would not see a leak either"


def test_refusing_host_rolls_back_the_others_and_bad_input_touches_nothing(sshd_cluster, tmp_path,
                                                                            nothing_leaves):
    cluster, inventory = sshd_cluster
    before = dump(cluster)
    text = inventory.read_text()
    inventory.write_text(text.replace('name = "h3"\naddress = "10.199.0.3"\nnic = "eth0"',
                                      'name = "h3"\naddress = "10.199.0.3"\nnic = "eth9"'))
    up = geryon("cluster", "up", inventory, "--json", state_dir=tmp_path)
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
    up = geryon("cluster", "up", inventory, state_dir=tmp_path)
    assert up.returncode == 1 and "does not match" in up.stdout and "refusing to connect" in up.stdout

    bad = tmp_path / "bad.toml"
    bad.write_text('[[class]]\nname = "a"\ndscp = [46]\nqueue = 7\nscheduler = "strict"\n'
                   '[[class]]\nname = "b"\ndscp = [46]\nqueue = 0\nweight = 10\n')
    inventory.write_text(text.replace('profile = "two-class"', f'profile = "{bad}"'))
    up = geryon("cluster", "up", inventory, state_dir=tmp_path)
    assert up.returncode == 1 and "DSCP 46 is in both class 'a' and class 'b'" in up.stderr
    assert dump(cluster) == before

    # an inventory that does not name the cluster would dial its addresses through the machine's own network
    inventory.write_text(re.sub(r"emulated = .*\n", "", text))
    up = geryon("cluster", "up", inventory, state_dir=tmp_path)
    assert up.returncode == 1 and "but the inventory names none of them" in up.stderr, up.stdout + up.stderr
    assert re.search(rf"emulated cluster\(s\) up now \([^)]*\b{cluster.name}\b", up.stderr)
    inventory.write_text(text.replace(f'emulated = "{cluster.name}"', 'emulated = "gone1"'))
    up = geryon("cluster", "check", inventory, state_dir=tmp_path)
    assert up.returncode == 1 and "emulated cluster 'gone1' is not up" in up.stderr, up.stdout + up.stderr
    assert dump(cluster) == before
