"""SONiC: the profile as config_db.json QoS tables, and as a YANG instance of the sonic-* models.

Follows the SONiC Configuration Database Manual (sonic-net/SONiC wiki, "Configuration" — tables
DSCP_TO_TC_MAP, TC_TO_QUEUE_MAP, SCHEDULER, QUEUE, PORT_QOS_MAP) and the sonic-yang-models
(sonic-dscp-tc-map, sonic-tc-queue-map, sonic-scheduler, sonic-queue, sonic-port-qos-map, sonic-port).

Tables produced (map name `GERYON`, schedulers `GERYON_Q<n>` and `GERYON_CONTROL`):
  DSCP_TO_TC_MAP|GERYON   all 64 DSCPs -> traffic class (= the class's queue); CS6/CS7 -> the control TC 7;
                          DSCP 3 and 4 -> TC 3 and 4 as in the stock AZURE map (the lossless RoCE classes)
                          unless a class lists them; every other DSCP -> the default class
  TC_TO_QUEUE_MAP|GERYON  tc n -> queue n (0..7, as the stock AZURE map)
  SCHEDULER|GERYON_*      type STRICT, or type DWRR with weight 1..100
  QUEUE|<port>|<n>        the `scheduler` field of each class's queue and of the control queue 7
  PORT_QOS_MAP|<port>     the `dscp_to_tc_map` and `tc_to_queue_map` fields of each port

Safe on a production switch (the stock tables of sonic-buildimage files/build_templates/qos_config.j2:
LOSSLESS_TC "3,4", PORT_QOS_MAP|<port> with pfc_enable "3,4", pfcwd_sw_enable, tc_to_pg_map,
pfc_to_queue_map and pfc_to_pg_map, QUEUE|<port>|3-4 with wred_profile AZURE_LOSSLESS, WRED_PROFILE,
and PFC_WD from the PFC watchdog; SONiC Configuration Database Manual, PORT_QOS_MAP / QUEUE / WRED_PROFILE):
  - geryon owns the GERYON maps and schedulers and the *fields* listed above, nothing else: the session
    (geryon.netconf.session) patches field by field, so a port's PFC, watchdog, priority-group and WRED
    fields stay as they were, and rolls back with the exact inverse of that patch.
  - Queues 3 and 4 are lossless by default (PFC, lossless priority groups, ECN via AZURE_LOSSLESS): a lossy
    class there is refused; a `lossless = true` class must sit there, because the buffers and PFC of a
    lossless queue are the platform's (buffer templates), not geryon's.
  - Network control: stock SONiC gives DSCP 48 its own TC 6; geryon keeps CS6 and CS7 on queue 7 under a
    STRICT scheduler above every class (a class on queue 7 moves to 6), so a saturated strict training
    class cannot starve BGP. SONiC documents no shaper for strict queues, so none is rendered.
  - DSCP_TO_TC_MAP applies to IPv4 and IPv6 alike (the DSCP field of either header; the manual does not
    say otherwise, and has no per-family map).
  - Verification: `show queue counters <port> --json` (sonic-utilities `queuestat -p <port> -j`: per
    queue "UC<n>"/"MC<n>" with totalpacket/totalbytes/droppacket/dropbytes, as sonic-utilities
    scripts/queuestat builds it), parsed by `parse_queue_counters`.

Pure ACKs (`ack_priority`) are refused: an ACL_RULE can match them by flags — `IP_PROTOCOL` 6 and
`TCP_FLAGS` "0x10/0x3f" (value/mask: exactly ACK among URG..FIN) — but the ACL_RULE match fields of the
SONiC Configuration Database Manual and ACL High Level Design (sonic-net/SONiC wiki "Configuration",
doc/acl/ACL-High-Level-Design.md: ETHER_TYPE, IP_TYPE, IP_PROTOCOL, SRC_IP, DST_IP, L4_SRC_PORT(_RANGE),
L4_DST_PORT(_RANGE), TCP_FLAGS, DSCP, ...) have no packet length, and a flags-only match would also take
every bulk data segment sent without PSH (the bulk of a transfer), reordering it against the rest.
The vendored models (tests/yang) have no sonic-acl model either, so such tables could not be validated.

Hazards:
  - Stock SONiC (the `AZURE` maps of qos.json.j2) puts DSCP 46 in TC 5 and queue 5 under a DWRR
    scheduler, i.e. a *weighted* queue: EF traffic is not served first until PORT_QOS_MAP points the
    port at our maps and the queue at a STRICT scheduler. Both are rendered here, per port.
  - The stock buffer templates make TC/queue 3 and 4 lossless (PFC); the built-in profiles avoid them.
  - config_db stores every value as a string; the YANG form needs numbers for uint8 leaves (tc, weight,
    speed) and strings for `dscp`/`qindex` (RFC 7951: uint8 as numbers, uint64 as strings).
  - The YANG form needs a PORT entry per port for the leafrefs; on a switch PORT comes from the running
    config, so `render_yang` adds placeholders (lanes = position, speed = the profile rate or 100G).
"""

from geryon.netconf.qos_profile import PLATFORM_LOSSLESS_QUEUES, QosProfile, TargetLimits
import json

from geryon.errors import ConfigError
from geryon.netconf.render import QueueCount, Rendering, counter, dscp_queues, dump_json

LIMITS = TargetLimits("sonic", max_strict=8, ack_match=None,
                      ack_why="an ACL_RULE matches TCP_FLAGS (0x10/0x3f) but has no packet-length field, so it "
                              "would also move every bulk data segment sent without PSH into the ACK queue",
                      control_queue=7, control_why="queue 7 carries network control (CS6/CS7), strict above "
                      "every class", lossless_queues=PLATFORM_LOSSLESS_QUEUES, lossless_fixed=True,
                      lossless_why="qos_config.j2 makes TCs 3 and 4 lossless: pfc_enable \"3,4\", lossless "
                                   "priority groups, WRED_PROFILE AZURE_LOSSLESS on queues 3 and 4")
MAP_NAME = "GERYON"
CONTROL_SCHEDULER = f"{MAP_NAME}_CONTROL"
STOCK_LOSSLESS_DSCPS = {3: 3, 4: 4}  # the stock AZURE DSCP_TO_TC_MAP: RoCE's DSCP 3 and 4 to the lossless TCs
NUM_TCS = 8
DEFAULT_PORTS = ("Ethernet0",)


def scheduler_name(queue: int) -> str:
    return f"{MAP_NAME}_Q{queue}"


def _ports(profile: QosProfile) -> tuple[str, ...]:
    return profile.ports or DEFAULT_PORTS


def config_db(profile: QosProfile) -> dict:
    """The QoS entries and fields geryon owns, in config_db form (every value a string)."""
    dscp_map = dscp_queues(profile, LIMITS.control_queue, STOCK_LOSSLESS_DSCPS)
    schedulers = {}
    for cls in profile.classes:
        entry = {"type": "STRICT"} if cls.strict else {"type": "DWRR", "weight": str(cls.weight)}
        schedulers[scheduler_name(cls.queue)] = entry
    schedulers[CONTROL_SCHEDULER] = {"type": "STRICT"}
    queues = {}
    for port in _ports(profile):
        for cls in profile.classes:
            queues[f"{port}|{cls.queue}"] = {"scheduler": scheduler_name(cls.queue)}
        queues[f"{port}|{LIMITS.control_queue}"] = {"scheduler": CONTROL_SCHEDULER}
    return {
        "DSCP_TO_TC_MAP": {MAP_NAME: {str(d): str(dscp_map[d]) for d in sorted(dscp_map)}},
        "TC_TO_QUEUE_MAP": {MAP_NAME: {str(tc): str(tc) for tc in range(NUM_TCS)}},
        "SCHEDULER": schedulers,
        "QUEUE": queues,
        "PORT_QOS_MAP": {port: {"dscp_to_tc_map": MAP_NAME, "tc_to_queue_map": MAP_NAME}
                         for port in _ports(profile)},
    }


def _notes(profile: QosProfile) -> tuple[str, ...]:
    notes = list(profile.notes)
    if not profile.ports:
        notes.append(f"no ports given: rendered for {', '.join(DEFAULT_PORTS)} (use --ports)")
    return tuple(notes)


def verify_commands(profile: QosProfile) -> tuple[str, ...]:
    return tuple(f"show queue counters {port} --json" for port in _ports(profile))


def parse_queue_counters(text: str, port: str | None = None) -> dict[str, dict[int, QueueCount]]:
    """`show queue counters PORT --json` (queuestat -j): {port: {"UC<n>": {totalpacket, totalbytes, droppacket,
    dropbytes}, "MC<n>": ..., "time": ...}} -> unicast queue n per port."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ConfigError("`show queue counters --json` did not print JSON: is sonic-utilities older than "
                          "its --json option? Read the table of `show queue counters PORT` instead") from None
    out: dict[str, dict[int, QueueCount]] = {}
    for port, queues in data.items():
        out[port] = {int(name[2:]): QueueCount(counter(c.get("totalpacket")), counter(c.get("totalbytes")),
                                               counter(c.get("droppacket")))
                     for name, c in queues.items() if name.startswith("UC") and name[2:].isdigit()}
    return out


def render(profile: QosProfile) -> Rendering:
    data = config_db(profile)
    return Rendering("sonic", profile, dump_json(data), data, _notes(profile), verify=verify_commands(profile))


def yang_instance(profile: QosProfile) -> dict:
    """The same tables as an RFC 7951 instance of the sonic-* YANG models (plus placeholder PORTs)."""
    db = config_db(profile)
    speed = (profile.rate // 10**6) if profile.rate and profile.rate >= 10**6 else 100000
    ports = _ports(profile)
    return {
        "sonic-port:sonic-port": {"PORT": {"PORT_LIST": [
            {"name": port, "lanes": str(index), "speed": speed} for index, port in enumerate(ports)]}},
        "sonic-dscp-tc-map:sonic-dscp-tc-map": {"DSCP_TO_TC_MAP": {"DSCP_TO_TC_MAP_LIST": [
            {"name": MAP_NAME, "DSCP_TO_TC_MAP": [{"dscp": dscp, "tc": int(tc)}
                                                 for dscp, tc in db["DSCP_TO_TC_MAP"][MAP_NAME].items()]}]}},
        "sonic-tc-queue-map:sonic-tc-queue-map": {"TC_TO_QUEUE_MAP": {"TC_TO_QUEUE_MAP_LIST": [
            {"name": MAP_NAME, "TC_TO_QUEUE_MAP": [{"tc": int(tc), "qindex": queue}
                                                   for tc, queue in db["TC_TO_QUEUE_MAP"][MAP_NAME].items()]}]}},
        "sonic-scheduler:sonic-scheduler": {"SCHEDULER": {"SCHEDULER_LIST": [
            {"name": name, **{k: (int(v) if k == "weight" else v) for k, v in entry.items()}}
            for name, entry in db["SCHEDULER"].items()]}},
        "sonic-queue:sonic-queue": {"QUEUE": {"QUEUE_LIST": [
            {"ifname": key.split("|")[0], "qindex": key.split("|")[1], **entry}
            for key, entry in db["QUEUE"].items()]}},
        "sonic-port-qos-map:sonic-port-qos-map": {"PORT_QOS_MAP": {"PORT_QOS_MAP_LIST": [
            {"ifname": port, **entry} for port, entry in db["PORT_QOS_MAP"].items()]}},
    }


def render_yang(profile: QosProfile) -> Rendering:
    data = yang_instance(profile)
    notes = _notes(profile) + ("PORT entries are placeholders so the leafrefs resolve; a switch has its own",)
    return Rendering("sonic", profile, dump_json(data), data, notes, verify=verify_commands(profile))
