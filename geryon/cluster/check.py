"""`cluster check`: prove that the classes hold on the real path, with real traffic.

1. Marking: for each class, one TCP flow of PROBE_BYTES with the class's DSCP from the first host to the
   second; the receiver sniffs its NIC (geryon.netconf.verify.DscpSniffer, run there over SSH) and must
   see every byte of it carrying that DSCP.
2. Queues: the per-class byte counters of the sender's NIC and of the switch port toward the receiver
   (Linux switches) are read before and after; each probe's bytes must land in its class. On a vendor
   switch the rendering's per-queue counter command (`Rendering.verify`, e.g. SONiC's `show queue
   counters PORT --json`) runs before and after each probe; where the target's module parses it
   (`parse_queue_counters`) the probe's packets must show in its class's queue, elsewhere the output is
   kept in the report for reading.
3. Contention: a flow of the highest class and one of the default class into the same receiver at the
   same time; the high class must take at least `HIGH_SHARE` of the bottleneck.
Needs iperf3 on every host for the contention test (Debian package iperf3) and geryon importable by
the inventory's `python`.
"""

import json
import re
import shlex
import threading
import time

from geryon.errors import GeryonError, RemoteError
from geryon.cluster.inventory import Inventory
from geryon.cluster.lifecycle import Report
from geryon.netconf.remote import SshShell
from geryon.netconf.render import QueueCount, render, target_module

BASE_PORT = 15201
PROBE_BYTES = 400_000
CONTENTION_S = 4
HIGH_SHARE = 0.75
# Receiver: sniff the NIC, accept one connection, read it to the end, then report what the wire carried.
RECEIVE_SNIPPET = """import json, socket, sys
from geryon.netconf.verify import DscpSniffer
nic, port = sys.argv[1], int(sys.argv[2])
sniffer = DscpSniffer(None, nic, f"tcp port {port}").start()
listener = socket.create_server(("", port))
listener.settimeout(60)
print("READY", flush=True)
conn, _ = listener.accept()
total = 0
while chunk := conn.recv(65536):
    total += len(chunk)
conn.close()
result = sniffer.stop().as_dict()
result["received"] = total
print(json.dumps(result), flush=True)
"""
# Sender: one TCP flow carrying the DSCP, closed cleanly so every byte has crossed the queues.
SEND_SNIPPET = """import socket, sys
address, port, tos, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sock = socket.socket()
sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
sock.connect((address, port))
sock.sendall(bytes(size))
sock.shutdown(socket.SHUT_WR)
sock.recv(1)
"""


def _connect(host) -> SshShell:
    return SshShell(host.endpoint, host.known_hosts)


def class_bytes(shell, dev: str) -> dict[str, int]:
    """Bytes sent per HTB class id on `dev` (`tc -s class show`)."""
    out = shell.check(f"tc -s class show dev {dev}")
    found, classid = {}, None
    for line in out.splitlines():
        match = re.match(r"class htb (\S+)", line)
        if match:
            classid = match.group(1)
        sent = re.match(r"\s*Sent (\d+) bytes", line)
        if sent and classid:
            found[classid] = int(sent.group(1))
    return found


def _class_ids(inventory: Inventory) -> dict[str, str]:
    return {cls.name: f"1:{0x10 + i:x}" for i, cls in enumerate(inventory.profile.classes)}


MIN_PROBE_PACKETS = PROBE_BYTES // 9000  # a probe's packets at the largest MTU: what its queue must count


def queue_delta(before: dict[int, QueueCount] | None, after: dict[int, QueueCount] | None, queue: int) -> int | None:
    """Packets the switch counted on `queue` between two parsed reads (None where it cannot say)."""
    if before is None or after is None or queue not in before or queue not in after:
        return None
    if before[queue].packets is None or after[queue].packets is None:
        return None
    return after[queue].packets - before[queue].packets


def _switch_read(switch, port: str, command: str):
    """Run the counter command on the switch; (raw output, {queue: QueueCount} or None where not parsed)."""
    with _connect(switch) as shell:
        out = shell.check(command)
    parse = getattr(target_module(switch.kind), "parse_queue_counters", None)
    return out, (parse(out, port).get(port) if parse else None)


def switch_queue_item(switch, port: str, cls, queue: int, command: str, before, after) -> dict:
    """The report item for one probe through a vendor switch port: parsed counters must show it."""
    item = {"name": f"switch queue {cls.name}", "target": f"{switch.name}:{port} queue {queue}", "command": command,
            "ok": True}
    delta = queue_delta(before[1], after[1], queue)
    if before[1] is None:
        item["parsed"] = False
        item["output"] = after[0][-2000:]
    elif delta is None:
        item.update(ok=False, packets=None,
                    error=f"{switch.name}:{port}: `{command}` gave no packet count for queue {queue}: run it by hand "
                          "and check that the queue and its transmitted-packets counter are in its output")
    elif delta < MIN_PROBE_PACKETS:
        item.update(ok=False, packets=delta,
                    error=f"{switch.name}:{port} counted {delta} packet(s) on queue {queue} for a probe of "
                          f"{PROBE_BYTES} bytes: the class lands elsewhere (check the DSCP map and the port binding)")
    else:
        item["packets"] = delta
    return item


def _background(shell, command: str) -> dict:
    """Run `command` in a thread; the dict gets 'rc', 'out', 'err' when it ends."""
    box: dict = {}

    def run():
        try:
            box["rc"], box["out"], box["err"] = shell.run(command, timeout=120)
        except RemoteError as exc:
            box["rc"], box["out"], box["err"] = -1, "", str(exc)

    box["thread"] = threading.Thread(target=run, daemon=True)
    box["thread"].start()
    return box


def _probe(inventory, sender, receiver, cls, port: int, item: dict) -> bool:
    dscp = cls.dscps[0] if cls.dscps else 0
    with _connect(receiver) as rshell, _connect(sender) as sshell:
        _, stdout, stderr = rshell.start(f"{receiver.python} -c {shlex.quote(RECEIVE_SNIPPET)} {receiver.nic} {port}")
        if stdout.readline().strip() != "READY":
            item["error"] = f"receiver on {receiver.name} did not start: {stderr.read().decode()[-300:]}"
            return False
        rc, out, err = sshell.run(f"{sender.python} -c {shlex.quote(SEND_SNIPPET)} {receiver.address} {port} "
                                  f"{dscp << 2} {PROBE_BYTES}")
        text = stdout.read().decode()
    if rc != 0:
        item["error"] = f"sending from {sender.name} failed: {err.strip()[-300:]}"
        return False
    try:
        result = json.loads(text)
    except ValueError:
        item["error"] = f"receiver on {receiver.name} gave no result: {text[-300:]}"
        return False
    marks = [m for m in result.get("marks", []) if m["source"] == sender.address]
    seen = {m["dscp"]: m["bytes"] for m in marks}
    item.update(seen_dscps=seen, received=result.get("received"))
    if result.get("received") != PROBE_BYTES or seen.get(dscp, 0) < PROBE_BYTES:
        item["error"] = f"receiver got {result.get('received')} bytes, saw DSCP {seen} from {sender.address}; " \
                        f"expected {PROBE_BYTES} bytes with DSCP {dscp}"
        return False
    others = {d: b for d, b in seen.items() if d != dscp}
    if others:
        item["error"] = f"part of the probe arrived with another DSCP: {others}"
        return False
    return True


def _contention(inventory, senders, receiver, item: dict) -> bool:
    high, low = inventory.profile.classes[0], inventory.profile.by_name(inventory.profile.default_class)
    shells = [_connect(receiver)] + [_connect(s) for s in senders]
    try:
        servers = [_background(shells[0], f"iperf3 -s -1 -p {BASE_PORT + 90 + i}") for i in range(2)]
        time.sleep(0.3)
        flows = []
        for i, (cls, sender_shell) in enumerate(zip((high, low), shells[1:])):
            dscp = cls.dscps[0] if cls.dscps else 0
            flows.append(_background(sender_shell, f"iperf3 -c {receiver.address} -p {BASE_PORT + 90 + i} "
                                                   f"-S {dscp << 2} -t {CONTENTION_S} -J"))
        for box in flows + servers:
            box["thread"].join(CONTENTION_S + 60)
    finally:
        for shell in shells:
            shell.close()
    rates = []
    for box in flows:
        try:
            rates.append(json.loads(box["out"])["end"]["sum_received"]["bits_per_second"])
        except (KeyError, ValueError, TypeError):
            item["error"] = f"iperf3 gave no result: {box.get('err', '')[-200:]}"
            return False
    share = rates[0] / max(sum(rates), 1)
    item.update(high_mbit=round(rates[0] / 1e6, 2), low_mbit=round(rates[1] / 1e6, 2), high_share=round(share, 3))
    if share < HIGH_SHARE:
        item["error"] = f"high class got {share:.0%} of the bottleneck (need {HIGH_SHARE:.0%})"
        return False
    return True


def cluster_check(inventory: Inventory) -> Report:
    report = Report("check")
    sender, receiver = inventory.hosts[0], inventory.hosts[1]
    ids = _class_ids(inventory)
    bottleneck = inventory.port_toward(receiver.name)
    counters = [(sender.name, sender, sender.nic)]
    vendor = None
    if bottleneck and bottleneck[0].kind == "linux":
        switch, port = bottleneck
        counters.append((switch.name, switch, port))
    elif bottleneck:  # a vendor switch: its own per-queue counters, the queues as it carries the profile
        switch, port = bottleneck
        carried = render(inventory.profile.with_ports([port]), switch.kind)
        vendor = (switch, port, carried.verify[0], {c.name: c.queue for c in carried.profile.classes})
    for index, cls in enumerate(inventory.profile.classes):
        item = {"name": f"mark {cls.name}", "target": f"{sender.name} -> {receiver.name} DSCP {cls.dscps[0]}",
                "ok": False}
        report.items.append(item)
        try:
            before = {name: class_bytes(SshShell(t.endpoint, t.known_hosts), dev) for name, t, dev in counters}
            switch_before = _switch_read(vendor[0], vendor[1], vendor[2]) if vendor else None
            ok = _probe(inventory, sender, receiver, cls, BASE_PORT + index, item)
            after = {name: class_bytes(SshShell(t.endpoint, t.known_hosts), dev) for name, t, dev in counters}
            switch_after = _switch_read(vendor[0], vendor[1], vendor[2]) if vendor else None
        except GeryonError as exc:
            item["error"] = str(exc)
            continue
        item["ok"] = ok
        if vendor:
            switch, port, command, queues = vendor
            report.items.append(switch_queue_item(switch, port, cls, queues[cls.name], command, switch_before,
                                                  switch_after))
        queue_item = {"name": f"queue {cls.name}", "target": ", ".join(f"{n}:{d}" for n, _, d in counters), "ok": True}
        deltas = {}
        for name, _, _ in counters:
            delta = {cid: after[name].get(cid, 0) - before[name].get(cid, 0) for cid in after[name]}
            deltas[name] = delta.get(ids[cls.name], 0)
            if delta.get(ids[cls.name], 0) < PROBE_BYTES // 2:
                queue_item["ok"] = False
                queue_item["error"] = f"{name}: class {ids[cls.name]} counted {delta.get(ids[cls.name], 0)} bytes"
        queue_item["bytes"] = deltas
        report.items.append(queue_item)
    senders = [inventory.hosts[0], inventory.hosts[2] if len(inventory.hosts) > 2 else inventory.hosts[0]]
    item = {"name": "contention", "target": f"{', '.join(s.name for s in senders)} -> {receiver.name}", "ok": False}
    report.items.append(item)
    try:
        item["ok"] = _contention(inventory, senders, receiver, item)
    except GeryonError as exc:
        item["error"] = str(exc)
    if not report.ok:
        report.advice.append("a class that is re-marked or lands in the wrong queue: check the switch's trust "
                             "setting and `geryon netconf render` for its kind; no contention win: is the "
                             "bottleneck port in the inventory's links?")
    return report
