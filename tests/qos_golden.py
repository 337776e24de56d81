"""Golden renderings of the built-in profiles: `python tests/qos_golden.py` rewrites them after a reviewed change."""

from dataclasses import replace
from pathlib import Path

from geryon.netconf.qos_profile import builtin_profile, load_profile
from geryon.netconf.render import TARGETS, render

GOLDEN = Path(__file__).parent / "golden" / "qos"
ACK_OWN_PROFILE = Path(__file__).resolve().parents[1] / "cluster" / "profiles" / "ack-own.toml"
PROFILES = {"2": "two-class", "4": "four-class"}
PORTS = {"linux": ["eth1"], "sonic": ["Ethernet0", "Ethernet4"], "openconfig": ["Ethernet0"],
         "eos": ["Ethernet1"], "nxos": ["Ethernet1/1"], "nvue": [], "junos": ["xe-0/0/0"]}
CASES = [(t, n, fmt) for t in TARGETS for n in PROFILES
         for fmt in (("native", "yang") if t == "sonic" else ("native",))]


def golden_path(target: str, count: str, fmt: str) -> Path:
    suffix = "json" if target in ("sonic", "openconfig") else "txt"
    return GOLDEN / f"{target}-{count}class{'-yang' if fmt == 'yang' else ''}.{suffix}"


def rendering(target: str, count: str, fmt: str):
    profile = builtin_profile(PROFILES[count])
    if PORTS[target]:
        profile = profile.with_ports(PORTS[target])
    return render(profile, target, fmt)


# The pure-ACK class: "top" on the two-class built-in, "own" on cluster/profiles/ack-own.toml, for every
# target that can carry it (sonic and nvue refuse both; junos and nxos, with one strict queue, refuse "own").
ACK_CASES = [("linux", "top"), ("eos", "top"), ("junos", "top"), ("nxos", "top"), ("openconfig", "top"),
             ("linux", "own"), ("eos", "own"), ("openconfig", "own")]


def ack_profile(target: str, mode: str):
    profile = (replace(builtin_profile("two-class"), ack_priority="top") if mode == "top"
               else load_profile(ACK_OWN_PROFILE))
    return profile.with_ports(PORTS[target]) if PORTS[target] else profile


def ack_golden_path(target: str, mode: str) -> Path:
    suffix = "json" if target in ("sonic", "openconfig") else "txt"
    return GOLDEN / f"{target}-ack{mode}.{suffix}"


def ack_rendering(target: str, mode: str):
    return render(ack_profile(target, mode), target)


if __name__ == "__main__":
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        golden_path(*case).write_text(rendering(*case).text)
        print(golden_path(*case))
    for case in ACK_CASES:
        ack_golden_path(*case).write_text(ack_rendering(*case).text)
        print(ack_golden_path(*case))
