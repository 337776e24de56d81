"""SONiC on a production fabric: a profile applied to a stock running config changes only geryon's fields
and rolls back exactly; lossless queues, network control and the per-queue counters.

The running config is built from the tables of sonic-buildimage's files/build_templates/qos_config.j2 (the
default QoS of every SONiC switch): PORT_QOS_MAP with pfc_enable "3,4", pfcwd_sw_enable, tc_to_pg_map,
pfc_to_queue_map; QUEUE|port|3-4 with wred_profile AZURE_LOSSLESS; WRED_PROFILE; plus the PFC watchdog's
PFC_WD entries and the lossless BUFFER_PG entries that the buffer templates add. The switch is a stand-in
shell that keeps that config and applies the RFC 6902 patches it is sent, as `config apply-patch` does.
"""

import copy
import json

import pytest

from geryon.errors import ApplyError, TargetLimitError
from geryon.netconf.qos_profile import QosClass, QosProfile, builtin_profile, validate_profile
from geryon.netconf.remote import Endpoint
from geryon.netconf.render import render
from geryon.netconf.render.sonic import parse_queue_counters
from geryon.netconf.session import _execute, apply_patch, inverse_patch, json_patch
from geryon.netconf.linuxapply import ApplyResult

PORTS = ("Ethernet0", "Ethernet4")
NOT_OURS = {"PORT_QOS_MAP": ("pfc_enable", "pfcwd_sw_enable", "tc_to_pg_map", "pfc_to_queue_map", "pfc_to_pg_map"),
            "QUEUE": ("wred_profile",)}


def stock_running() -> dict:
    """SONiC's default QoS tables (qos_config.j2) for two active ports, as `show runningconfiguration all`."""
    identity = {str(i): str(i) for i in range(8)}
    azure_dscp = {str(d): "1" for d in range(64)}
    azure_dscp.update({"3": "3", "4": "4", "5": "2", "8": "0", "46": "5", "48": "6"})
    port_qos = {"global": {"dscp_to_tc_map": "AZURE"}}
    queues, pfc_wd, buffer_pg = {}, {"GLOBAL": {"POLL_INTERVAL": "200"}}, {}
    for port in PORTS:
        port_qos[port] = {"dscp_to_tc_map": "AZURE", "tc_to_queue_map": "AZURE", "pfc_to_pg_map": "AZURE",
                          "pfc_enable": "3,4", "pfcwd_sw_enable": "3,4", "tc_to_pg_map": "AZURE",
                          "pfc_to_queue_map": "AZURE"}
        queues.update({f"{port}|3": {"scheduler": "scheduler.1", "wred_profile": "AZURE_LOSSLESS"},
                       f"{port}|4": {"scheduler": "scheduler.1", "wred_profile": "AZURE_LOSSLESS"}})
        queues.update({f"{port}|{q}": {"scheduler": "scheduler.0"} for q in (0, 1, 2, 5, 6)})
        pfc_wd[port] = {"action": "drop", "detection_time": "200", "restoration_time": "200"}
        buffer_pg[f"{port}|3-4"] = {"profile": "pg_lossless_100000_5m_profile"}
        buffer_pg[f"{port}|0"] = {"profile": "ingress_lossy_profile"}
    wred = {"wred_green_enable": "true", "wred_yellow_enable": "true", "wred_red_enable": "true", "ecn": "ecn_all",
            "green_max_threshold": "2097152", "green_min_threshold": "1048576", "yellow_max_threshold": "2097152",
            "yellow_min_threshold": "1048576", "red_max_threshold": "2097152", "red_min_threshold": "1048576",
            "green_drop_probability": "5", "yellow_drop_probability": "5", "red_drop_probability": "5"}
    return {
        "TC_TO_PRIORITY_GROUP_MAP": {"AZURE": {**{str(i): "0" for i in range(8)}, "3": "3", "4": "4", "7": "7"}},
        "MAP_PFC_PRIORITY_TO_QUEUE": {"AZURE": identity}, "TC_TO_QUEUE_MAP": {"AZURE": dict(identity)},
        "DSCP_TO_TC_MAP": {"AZURE": azure_dscp},
        "SCHEDULER": {"scheduler.0": {"type": "DWRR", "weight": "14"}, "scheduler.1": {"type": "DWRR", "weight": "15"}},
        "PFC_PRIORITY_TO_PRIORITY_GROUP_MAP": {"AZURE": {"3": "3", "4": "4"}},
        "PORT_QOS_MAP": port_qos, "WRED_PROFILE": {"AZURE_LOSSLESS": wred}, "QUEUE": queues,
        "PFC_WD": pfc_wd, "BUFFER_PG": buffer_pg,
    }


class StockSonic:
    """A stand-in SONiC shell: `show runningconfiguration all` prints its config, `config apply-patch` applies
    the RFC 6902 patch on stdin; `tamper` (table, key, field, value) is a field it sets after the first patch,
    as a switch whose apply did not take, or whose other fields something else changed."""

    def __init__(self, running: dict, tamper: tuple[str, str, str, str] | None = None):
        self.running = copy.deepcopy(running)
        self.tamper = tamper
        self.patches: list[list[dict]] = []
        self.log: list[str] = []

    def check(self, command: str, stdin: str | None = None, timeout=None) -> str:
        self.log.append(command)
        if command == "show runningconfiguration all":
            return json.dumps(self.running)
        if "config apply-patch" in command:
            ops = json.loads(stdin)
            self.patches.append(ops)
            self.running = apply_patch(self.running, ops)
            if self.tamper and len(self.patches) == 1:
                table, key, name, value = self.tamper
                self.running[table][key][name] = value
        return ""

    def run(self, command: str, stdin: str | None = None, timeout=None):
        return 0, self.check(command, stdin), ""


def profile(*classes, ports=PORTS):
    return validate_profile(QosProfile("p", tuple(classes), classes[-1].name, ports=ports))


def apply_to(switch: StockSonic, prof) -> ApplyResult:
    rendering = render(prof, "sonic")
    return _execute(rendering, Endpoint("sonic", "192.0.2.1"), switch, ApplyResult("sonic@192.0.2.1"))


def without_owned(config: dict) -> dict:
    """The config less geryon's entries and fields: what an apply must leave exactly as it was."""
    out = copy.deepcopy(config)
    for table in ("DSCP_TO_TC_MAP", "TC_TO_QUEUE_MAP", "SCHEDULER"):
        for key in [k for k in out.get(table, {}) if k.startswith("GERYON")]:
            del out[table][key]
    for key in out["PORT_QOS_MAP"]:
        if key in PORTS:
            out["PORT_QOS_MAP"][key] = {k: v for k, v in out["PORT_QOS_MAP"][key].items()
                                       if k not in ("dscp_to_tc_map", "tc_to_queue_map")}
    for key, entry in list(out["QUEUE"].items()):
        entry.pop("scheduler", None)
        if not entry:
            del out["QUEUE"][key]
    return out


@pytest.mark.parametrize("name", ["two-class", "four-class"])
def test_apply_leaves_every_pfc_wred_and_watchdog_field_as_it_was(name):
    stock = stock_running()
    switch = StockSonic(stock)
    result = apply_to(switch, builtin_profile(name).with_ports(PORTS))
    assert result.changed and result.steps[-2:] == ["read back: matches", "drop the checkpoint"]
    after = switch.running
    assert without_owned(after) == without_owned(stock)
    for port in PORTS:
        for field in NOT_OURS["PORT_QOS_MAP"]:
            assert after["PORT_QOS_MAP"][port][field] == stock["PORT_QOS_MAP"][port][field]
        assert after["PORT_QOS_MAP"][port]["dscp_to_tc_map"] == "GERYON"
        for queue in (3, 4):  # lossless: no class of the built-ins there, so not even its scheduler changes
            assert after["QUEUE"][f"{port}|{queue}"] == stock["QUEUE"][f"{port}|{queue}"]
    assert after["PFC_WD"] == stock["PFC_WD"] and after["WRED_PROFILE"] == stock["WRED_PROFILE"]
    assert after["BUFFER_PG"] == stock["BUFFER_PG"] and after["PORT_QOS_MAP"]["global"] == {"dscp_to_tc_map": "AZURE"}
    # every operation names one field (or a new entry of geryon's own), never a whole stock entry
    for op in switch.patches[0]:
        parts = op["path"].split("/")
        assert op["op"] in ("add", "replace")
        if parts[1] in ("PORT_QOS_MAP", "QUEUE") and parts[2].replace("~1", "/") in stock[parts[1]]:
            assert len(parts) == 4, op
    # applied again: nothing to do
    again = apply_to(switch, builtin_profile(name).with_ports(PORTS))
    assert not again.changed and len(switch.patches) == 1


def test_failed_read_back_rolls_back_to_the_exact_running_config():
    stock = stock_running()
    switch = StockSonic(stock, tamper=("PORT_QOS_MAP", "Ethernet4", "tc_to_queue_map", "AZURE"))
    with pytest.raises(ApplyError, match="read back .* rolled back with `roll back: the inverse patch: .*apply-patch"):
        apply_to(switch, builtin_profile("four-class").with_ports(PORTS))
    assert len(switch.patches) == 2 and switch.running == stock
    assert "sudo config rollback geryon-qos" not in switch.log  # the inverse patch, not the whole checkpoint


def test_read_back_catches_a_field_geryon_does_not_own_changing():
    stock = stock_running()
    switch = StockSonic(stock, tamper=("PORT_QOS_MAP", "Ethernet0", "pfc_enable", "4"))
    with pytest.raises(ApplyError, match="PORT_QOS_MAP|Ethernet0"):
        apply_to(switch, builtin_profile("two-class").with_ports(PORTS))
    assert switch.running["PORT_QOS_MAP"]["Ethernet0"]["dscp_to_tc_map"] == "AZURE"


def test_inverse_patch_restores_added_and_replaced_fields_and_entries():
    stock = stock_running()
    desired = {"PORT_QOS_MAP": {"Ethernet0": {"dscp_to_tc_map": "G"}, "Ethernet8": {"dscp_to_tc_map": "G"}},
               "QUEUE": {"Ethernet0|3": {"scheduler": "S"}, "Ethernet0|7": {"scheduler": "S"}},
               "NEWTABLE": {"a": {"b": "c"}}}
    ops = json_patch(stock, desired)
    assert {"op": "replace", "path": "/QUEUE/Ethernet0|3/scheduler", "value": "S"} in ops
    changed = apply_patch(stock, ops)
    assert changed["QUEUE"]["Ethernet0|3"] == {"scheduler": "S", "wred_profile": "AZURE_LOSSLESS"}
    assert apply_patch(changed, inverse_patch(stock, ops)) == stock


def test_stock_lossless_dscps_keep_their_lossless_tcs():
    data = render(builtin_profile("four-class"), "sonic").data
    dscp = data["DSCP_TO_TC_MAP"]["GERYON"]
    assert dscp["3"] == "3" and dscp["4"] == "4" and dscp["5"] == "0"
    assert data["TC_TO_QUEUE_MAP"]["GERYON"] == {str(i): str(i) for i in range(8)}


@pytest.mark.parametrize("queue", [3, 4])
def test_lossy_class_on_a_default_lossless_queue_is_refused_naming_it(queue):
    prof = profile(QosClass("high", (46,), 6, "strict"), QosClass("bulk", (10,), queue, "weighted", 50),
                   QosClass("low", (0,), 0, "weighted", 50))
    with pytest.raises(TargetLimitError, match=f"'bulk'.*lossy but queue {queue} is lossless"):
        render(prof, "sonic")


def test_lossless_class_rides_the_platform_lossless_queue_and_keeps_its_wred():
    roce = QosClass("roce", (26,), 3, "weighted", 50, lossless=True)
    prof = profile(QosClass("high", (46,), 6, "strict"), roce, QosClass("low", (0,), 0, "weighted", 50))
    data = render(prof, "sonic").data
    assert data["DSCP_TO_TC_MAP"]["GERYON"]["26"] == "3" and data["DSCP_TO_TC_MAP"]["GERYON"]["4"] == "4"
    switch = StockSonic(stock_running())
    apply_to(switch, prof)
    assert switch.running["QUEUE"]["Ethernet0|3"] == {"scheduler": "GERYON_Q3", "wred_profile": "AZURE_LOSSLESS"}
    assert switch.running["PORT_QOS_MAP"]["Ethernet0"]["pfc_enable"] == "3,4"
    elsewhere = profile(QosClass("high", (46,), 6, "strict"), QosClass("roce", (26,), 5, "weighted", 50, lossless=True),
                        QosClass("low", (0,), 0, "weighted", 50))
    with pytest.raises(TargetLimitError, match="lossless, which this target gives only queue.s. 3, 4"):
        render(elsewhere, "sonic")


def test_network_control_keeps_a_strict_queue_above_every_class():
    rendering = render(builtin_profile("two-class"), "sonic")
    data = rendering.data
    assert data["DSCP_TO_TC_MAP"]["GERYON"]["48"] == "7" and data["DSCP_TO_TC_MAP"]["GERYON"]["56"] == "7"
    assert data["SCHEDULER"][data["QUEUE"]["Ethernet0|7"]["scheduler"]] == {"type": "STRICT"}
    assert max(cls.queue for cls in rendering.profile.classes) == 6  # the top class moved below control
    assert any("moved from queue 7 to 6" in note for note in rendering.notes)


def test_queue_counters_command_and_parse():
    rendering = render(builtin_profile("two-class").with_ports(PORTS), "sonic")
    assert rendering.verify == ("show queue counters Ethernet0 --json", "show queue counters Ethernet4 --json")
    assert rendering.as_dict()["verify"] == list(rendering.verify)
    sample = {"Ethernet0": {"time": "2026-01-01T00:00:00",
                            "UC0": {"totalpacket": "1200", "totalbytes": "1,800,000", "droppacket": "3",
                                    "dropbytes": "4500"},
                            "UC6": {"totalpacket": "10", "totalbytes": "15000", "droppacket": "0", "dropbytes": "0"},
                            "UC7": {"totalpacket": "N/A", "totalbytes": "N/A", "droppacket": "N/A", "dropbytes": "N/A"},
                            "MC8": {"totalpacket": "5", "totalbytes": "320", "droppacket": "0", "dropbytes": "0"}}}
    parsed = parse_queue_counters(json.dumps(sample))["Ethernet0"]
    assert sorted(parsed) == [0, 6, 7]
    assert (parsed[0].packets, parsed[0].bytes, parsed[0].dropped_packets) == (1200, 1800000, 3)
    assert parsed[7].packets is None


def test_cluster_check_reads_the_probe_in_its_switch_queue():
    """`geryon cluster check` on a SONiC bottleneck: the probe's packets must show in its class's queue."""
    from types import SimpleNamespace

    from geryon.cluster.check import MIN_PROBE_PACKETS, switch_queue_item

    def read(packets_by_queue):
        text = json.dumps({"Ethernet4": {f"UC{q}": {"totalpacket": str(n), "totalbytes": str(n * 1500),
                                                     "droppacket": "0", "dropbytes": "0"}
                                          for q, n in packets_by_queue.items()}})
        return text, parse_queue_counters(text)["Ethernet4"]

    switch, high = SimpleNamespace(name="leaf1", kind="sonic"), QosClass("high", (46,), 6, "strict")
    command = render(builtin_profile("two-class").with_ports(["Ethernet4"]), "sonic").verify[0]
    before = read({0: 100, 6: 10, 7: 5})
    landed = switch_queue_item(switch, "Ethernet4", high, 6, command, before, read({0: 100, 6: 300, 7: 6}))
    assert landed["ok"] and landed["packets"] == 290 and landed["command"] == "show queue counters Ethernet4 --json"
    elsewhere = switch_queue_item(switch, "Ethernet4", high, 6, command, before, read({0: 390, 6: 10, 7: 6}))
    assert not elsewhere["ok"] and elsewhere["packets"] == 0 and "lands elsewhere" in elsewhere["error"]
    assert MIN_PROBE_PACKETS > 0
    unparsed = switch_queue_item(SimpleNamespace(name="leaf2", kind="linux"), "eth1", high, 6,
                                 "tc -s class show dev eth1", ("class htb 1:16 ...", None),
                                 ("class htb 1:16 ... Sent 400000 bytes", None))
    assert unparsed["ok"] and unparsed["parsed"] is False and unparsed["output"].endswith("Sent 400000 bytes")
