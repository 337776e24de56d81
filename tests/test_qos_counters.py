"""Per-queue counters of the CLI switches: each rendering names a JSON-printing command, its module parses that
JSON into QueueCount records keyed by the queue geryon renders (traffic class = queue), and `geryon cluster
check` reads a probe's packets from them. The samples follow each vendor's documented layout (named per test)."""

import json
from types import SimpleNamespace

import pytest

from geryon.errors import ConfigError
from geryon.netconf.qos_profile import QosClass, builtin_profile
from geryon.netconf.render import QueueCount, render, target_module

PORTS = {"eos": "Ethernet1", "nxos": "Ethernet1/1", "junos": "xe-0/0/0", "nvue": "swp1"}
COMMANDS = {"eos": "show interfaces Ethernet1 counters queue detail | json",
            "nxos": "show queuing interface Ethernet1/1 | json",
            "junos": "show interfaces queue xe-0/0/0 | display json",
            "nvue": "nv show interface swp1 counters qos egress-queue-stats -o json"}


def eos_sample(packets_by_tc: dict[int, int], port: str = "Ethernet1") -> str:
    """`show interfaces PORT counters queue detail | json` as Arista's ANTA test VerifyInterfacesEgressQueueDrops
    reads it (egressQueueCounters/interfaces/PORT/ucastQueues/trafficClasses/TC<n>/dropPrecedences/DP<k>), with
    the enqueued/dropped field names of EOS's queue-counter JSON; packets split over DP0 and DP1."""
    def tc(n):
        half = n // 2
        return {"dropPrecedences": {
            "DP0": {"enqueuedPackets": half, "enqueuedBytes": half * 1500, "droppedPackets": 1, "droppedBytes": 1500},
            "DP1": {"enqueuedPackets": n - half, "enqueuedBytes": (n - half) * 1500, "droppedPackets": 2,
                    "droppedBytes": 3000}}}
    classes = {f"TC{q}": tc(n) for q, n in packets_by_tc.items()}
    return json.dumps({"egressQueueCounters": {"interfaces": {port: {
        "ucastQueues": {"trafficClasses": classes},
        "mcastQueues": {"trafficClasses": {"TC0": tc(999)}}}}}})


def test_eos_queue_counters_parse():
    parsed = target_module("eos").parse_queue_counters(eos_sample({0: 1200, 6: 11}), "Ethernet1")["Ethernet1"]
    assert sorted(parsed) == [0, 6]
    assert parsed[0] == QueueCount(1200, 1800000, 3)  # unicast only, summed over drop precedences
    assert parsed[6] == QueueCount(11, 16500, 3)


def test_eos_missing_enqueued_field_reads_none():
    """ANTA confirms droppedPackets only: an absent enqueued field must read None, never 0."""
    text = json.dumps({"egressQueueCounters": {"interfaces": {"Ethernet1": {"ucastQueues": {"trafficClasses": {
        "TC6": {"dropPrecedences": {"DP0": {"droppedPackets": 4}}}}}}}}})
    parsed = target_module("eos").parse_queue_counters(text)["Ethernet1"]
    assert parsed[6] == QueueCount(None, None, 4)


def test_nxos_queue_counters_parse():
    """The NX-API schema of `show queuing` (Cisco Nexus 9000 NX-OS Command Reference, Show Commands 9.3(x)):
    TABLE_module/ROW_module/TABLE_queuing_interface (dir, if_name_str)/TABLE_qosgrp_egress_stats (eq-qosgrp)/
    TABLE_qosgrp_egress_stats_entry (eq-stat-type, eq-stat-units, eq-uc-stat-value, eq-mc-stat-value); a single
    row is an object, as NX-API prints it; the NX-API envelope is read too."""
    def group(qos, tx, dropped):
        return {"eq-qosgrp": qos, "TABLE_qosgrp_egress_stats_entry": {"ROW_qosgrp_egress_stats_entry": [
            {"eq-stat-type": "Tx", "eq-stat-units": "Pkts", "eq-uc-stat-value": str(tx), "eq-mc-stat-value": "77"},
            {"eq-stat-type": "Tx", "eq-stat-units": "Byts", "eq-uc-stat-value": str(tx * 1500),
             "eq-mc-stat-value": "0"},
            {"eq-stat-type": "Dropped", "eq-stat-units": "Pkts", "eq-uc-stat-value": str(dropped),
             "eq-mc-stat-value": "0"},
            {"eq-stat-type": "Dropped", "eq-stat-units": "Byts", "eq-uc-stat-value": str(dropped * 1500),
             "eq-mc-stat-value": "0"}]}}
    body = {"TABLE_module": {"ROW_module": {"module": "1", "TABLE_queuing_interface": {"ROW_queuing_interface": [
        {"dir": "Egress", "if_name_str": "Ethernet1/1", "TABLE_qosgrp_egress_stats": {"ROW_qosgrp_egress_stats": [
            group("0", 5000, 2), group("6", 40, 0), group("CONTROL QOS GROUP", 9, 0)]}},
        {"dir": "Ingress", "if_name_str": "Ethernet1/1"}]}}}}
    parse = target_module("nxos").parse_queue_counters
    parsed = parse(json.dumps(body), "Ethernet1/1")["Ethernet1/1"]
    assert sorted(parsed) == [0, 6]
    assert parsed[0] == QueueCount(5000, 7500000, 2)  # unicast values, not the multicast 77
    assert parsed[6].packets == 40
    envelope = {"ins_api": {"outputs": {"output": {"code": "200", "msg": "Success", "body": body}}}}
    assert parse(json.dumps(envelope))["Ethernet1/1"] == parsed


def test_junos_queue_counters_parse():
    """Junos's JSON mapping of XML replies ("Map Junos OS Command Output to JSON in the CLI": elements are lists
    of objects, text under "data") of get-interface-queue-information, with the queue-counters elements that
    czerwonk/junos_exporter reads (pkg/features/interfacequeue/rpc.go)."""
    def leaf(value):
        return [{"data": str(value)}]

    def queue(number, trans, drops):
        return {"queue-number": leaf(number), "forwarding-class-name": leaf(f"fc{number}"),
                "queue-counters-queued-packets": leaf(trans + drops),
                "queue-counters-trans-packets": leaf(trans), "queue-counters-trans-bytes": leaf(trans * 1500),
                "queue-counters-total-drop-packets": leaf(drops)}
    sample = {"interface-information": [{
        "attributes": {"xmlns": "http://xml.juniper.net/junos/23.4R1/junos-interface"},
        "physical-interface": [{"name": leaf("\nxe-0/0/0\n"), "queue-counters": [{
            "interface-cos-summary": [{"intf-cos-num-queues-supported": leaf(8)}],
            "queue": [queue(0, 300, 5), queue(6, 12, 0), queue(7, 3, 0)]}]}]}]}
    parsed = target_module("junos").parse_queue_counters(json.dumps(sample), "xe-0/0/0")["xe-0/0/0"]
    assert sorted(parsed) == [0, 6, 7]
    assert parsed[0] == QueueCount(300, 450000, 5)
    assert parsed[6] == QueueCount(12, 18000, 0)


def test_nvue_queue_counters_parse():
    """The columns the NVUE Command Reference documents for `nv show interface <id> counters qos
    egress-queue-stats` (traffic-class, tx-frames, tx-bytes, tx-uc-buffer-discards, wred-discards), as JSON keyed
    by traffic class, the form NVIDIA's own switch tests read with `-o json`."""
    sample = {str(tc): {"tx-frames": 10 * tc, "tx-bytes": 15000 * tc, "tx-uc-buffer-discards": tc,
                        "wred-discards": 1} for tc in range(8)}
    parse = target_module("nvue").parse_queue_counters
    parsed = parse(json.dumps(sample), "swp1")["swp1"]
    assert sorted(parsed) == list(range(8))
    assert parsed[6] == QueueCount(60, 90000, 7)
    with pytest.raises(ConfigError, match="does not name its port"):
        parse(json.dumps(sample))


@pytest.mark.parametrize("target", sorted(PORTS))
def test_rendering_names_the_json_command(target):
    rendering = render(builtin_profile("two-class").with_ports([PORTS[target]]), target)
    assert rendering.verify == (COMMANDS[target],)


@pytest.mark.parametrize("target", sorted(PORTS))
def test_text_instead_of_json_is_a_config_error(target):
    with pytest.raises(ConfigError, match="did not print JSON"):
        target_module(target).parse_queue_counters("Tx-Queue  Pkts  Bytes\n", PORTS[target])


def test_cluster_check_reads_the_probe_on_an_eos_bottleneck():
    """`geryon cluster check` through an EOS port: the probe's packets must show in its class's traffic class."""
    from geryon.cluster.check import switch_queue_item
    parse = target_module("eos").parse_queue_counters

    def read(packets_by_tc):
        text = eos_sample(packets_by_tc)
        return text, parse(text, "Ethernet1")["Ethernet1"]

    switch, high = SimpleNamespace(name="leaf1", kind="eos"), QosClass("high", (46,), 6, "strict")
    before = read({0: 100, 6: 10})
    landed = switch_queue_item(switch, "Ethernet1", high, 6, COMMANDS["eos"], before, read({0: 100, 6: 310}))
    assert landed["ok"] and landed["packets"] == 300
    elsewhere = switch_queue_item(switch, "Ethernet1", high, 6, COMMANDS["eos"], before, read({0: 400, 6: 10}))
    assert not elsewhere["ok"] and elsewhere["packets"] == 0
    missing = json.dumps({"egressQueueCounters": {"interfaces": {"Ethernet1": {"ucastQueues": {"trafficClasses": {
        "TC6": {"dropPrecedences": {"DP0": {"droppedPackets": 0}}}}}}}}})
    unread = (missing, parse(missing, "Ethernet1")["Ethernet1"])
    uncounted = switch_queue_item(switch, "Ethernet1", high, 6, COMMANDS["eos"], unread, unread)
    assert not uncounted["ok"] and uncounted["packets"] is None and "no packet count for queue 6" in uncounted["error"]
