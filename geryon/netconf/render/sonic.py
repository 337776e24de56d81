"""SONiC: the profile as config_db.json QoS tables, and as a YANG instance of the sonic-* models.

Follows the SONiC Configuration Database Manual (sonic-net/SONiC wiki, "Configuration" — tables
DSCP_TO_TC_MAP, TC_TO_QUEUE_MAP, SCHEDULER, QUEUE, PORT_QOS_MAP) and the sonic-yang-models
(sonic-dscp-tc-map, sonic-tc-queue-map, sonic-scheduler, sonic-queue, sonic-port-qos-map, sonic-port).

Tables produced (map name `GERYON`, schedulers `GERYON_Q<n>`):
  DSCP_TO_TC_MAP|GERYON   all 64 DSCPs -> traffic class (= the class's queue), unlisted ones to the default
  TC_TO_QUEUE_MAP|GERYON  tc n -> queue n
  SCHEDULER|GERYON_Q<n>   type STRICT, or type DWRR with weight 1..100
  QUEUE|<port>|<n>        scheduler per port and queue
  PORT_QOS_MAP|<port>     dscp_to_tc_map and tc_to_queue_map bound on each port

Pure ACKs (`ack_priority`) are refused: an ACL_RULE can match them by flags — `IP_PROTOCOL` 6 and
`TCP_FLAGS` "0x10/0x3f" (value/mask: exactly ACK among URG..FIN) — but the ACL_RULE match fields of the
SONiC Configuration Database Manual and ACL High Level Design (sonic-net/SONiC wiki "Configuration",
doc/acl/ACL-High-Level-Design.md: ETHER_TYPE, IP_TYPE, IP_PROTOCOL, SRC_IP, DST_IP, L4_SRC_PORT(_RANGE),
L4_DST_PORT(_RANGE), TCP_FLAGS, DSCP, ...) have no packet length, and a flags-only match would also take
every bulk data segment sent without PSH (the bulk of a transfer), reordering it against the rest.
../shared/yang has no sonic-acl model either, so such tables could not be validated here.

Hazards:
  - Stock SONiC (the `AZURE` maps of qos.json.j2) puts DSCP 46 in TC 5 and queue 5 under a DWRR
    scheduler, i.e. a *weighted* queue: EF traffic is not served first until PORT_QOS_MAP points the
    port at our maps and the queue at a STRICT scheduler. Both are rendered here, per port.
  - The stock buffer templates make TC/queue 3 and 4 lossless (PFC); the built-in profiles avoid them.
  - config_db stores every value as a string; the YANG form needs numbers for uint8 leaves (tc, weight,
    speed) and strings for `dscp`/`qindex` (see ../shared/yang/README.md, "Values as strings").
  - The YANG form needs a PORT entry per port for the leafrefs; on a switch PORT comes from the running
    config, so `render_yang` adds placeholders (lanes = position, speed = the profile rate or 100G).
"""

from geryon.netconf.qos_profile import QosProfile, TargetLimits
from geryon.netconf.render import Rendering, dump_json

LIMITS = TargetLimits("sonic", max_strict=8, ack_match=None,
                      ack_why="an ACL_RULE matches TCP_FLAGS (0x10/0x3f) but has no packet-length field, so it "
                              "would also move every bulk data segment sent without PSH into the ACK queue")
MAP_NAME = "GERYON"
DEFAULT_PORTS = ("Ethernet0",)


def scheduler_name(queue: int) -> str:
    return f"{MAP_NAME}_Q{queue}"


def _ports(profile: QosProfile) -> tuple[str, ...]:
    return profile.ports or DEFAULT_PORTS


def config_db(profile: QosProfile) -> dict:
    """The five QoS tables in config_db form (every value a string)."""
    dscp_map = profile.dscp_map()
    schedulers = {}
    for cls in profile.classes:
        entry = {"type": "STRICT"} if cls.strict else {"type": "DWRR", "weight": str(cls.weight)}
        schedulers[scheduler_name(cls.queue)] = entry
    queues = {f"{port}|{cls.queue}": {"scheduler": scheduler_name(cls.queue)}
              for port in _ports(profile) for cls in profile.classes}
    return {
        "DSCP_TO_TC_MAP": {MAP_NAME: {str(d): str(dscp_map[d].queue) for d in sorted(dscp_map)}},
        "TC_TO_QUEUE_MAP": {MAP_NAME: {str(c.queue): str(c.queue) for c in sorted(profile.classes,
                                                                               key=lambda c: c.queue)}},
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


def render(profile: QosProfile) -> Rendering:
    data = config_db(profile)
    return Rendering("sonic", profile, dump_json(data), data, _notes(profile))


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
    return Rendering("sonic", profile, dump_json(data), data, notes)
