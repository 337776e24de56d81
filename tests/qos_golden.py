"""Golden renderings of the built-in profiles: `python tests/qos_golden.py` rewrites them after a reviewed change."""

from pathlib import Path

from geryon.netconf.profile import builtin_profile
from geryon.netconf.render import TARGETS, render

GOLDEN = Path(__file__).parent / "golden" / "qos"
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


if __name__ == "__main__":
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        golden_path(*case).write_text(rendering(*case).text)
        print(golden_path(*case))
