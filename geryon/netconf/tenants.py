"""Tenants: several training jobs and their background traffic on one fabric, as one QoS profile.

One job's scheduler can put its own urgent tensors ahead of its own bulk, but it cannot see another job's
bulk on the same switch port, nor a checkpoint upload. A tenants file describes every job sharing the
fabric, and `tenant_profile` turns it into an ordinary `QosProfile` of fabric classes, highest first:

    urgent   every job's urgent class (the tensors the next iteration waits for), strict, on top
    bulk     every job's bulk class and unmarked traffic (DSCP 0, the default class)
    background  checkpoint writers, dataset readers (BACKGROUND_DSCP, CS1), a guaranteed share

so every renderer of `geryon.netconf.render` (Linux tc and every switch target) carries it as it carries
any profile, with the switch rules kept: no class on network control's queue 7 or CS6/CS7, none on the
platform-lossless queues 3 and 4 (the layouts in TENANT_QUEUES avoid them).

Job weights (Crux's idea, SIGCOMM 2024: the job that loses the most GPU time per byte delayed goes first):
when the tenants have different weights, the urgent class splits into up to MAX_URGENT_LEVELS levels, one
per distinct weight, heaviest first. The top level is strict; lower levels are weighted above bulk, with
shares in proportion to their jobs' weights, so a target with one strict queue (NX-OS, Junos) renders
them too. Jobs of equal weight share a level.

The background class keeps at least `background_percent` of the link (its `min_share`): Linux tc, and so
the emulated cluster, guarantees it even under the strict urgent class; a switch gives it that share of
what the strict class leaves (its DWRR weight), which is why only a job's urgent tensors (a small part of
its bytes) belong in the strict class.

A tenants file (TOML):

    name = "fabric"
    background_percent = 10          # optional, default BACKGROUND_PERCENT
    rate = "100gbit"                 # optional, as in a profile
    ports = ["Ethernet0"]            # optional, as in a profile

    [[tenant]]
    name = "vgg19-ps"
    weight = 3                       # optional, default 1: GPU time lost per byte delayed, relative

    [[tenant]]
    name = "resnet50-ring"

A job joins with `python -m geryon.launch --tenants FILE --tenant NAME`: its high class goes on its
urgent level's DSCP and its low class on bulk's (`tenant_classes`).
"""

from dataclasses import dataclass
from pathlib import Path

from geryon.errors import QosProfileError
from geryon.netconf.classes import HIGH_DSCP, LOW_DSCP, PriorityClass, format_classes
from geryon.netconf.qos_profile import (STRICT, WEIGHTED, QosClass, QosProfile, fabric_rate_and_ports, read_toml,
                                        refuse_unknown_keys, validate_profile)

BACKGROUND_DSCP = 8  # CS1, "low-priority data" (RFC 4594): checkpoint writers, data loaders, backups
BACKGROUND_PERCENT = 10  # the background class's guaranteed share among the weighted classes, default
URGENT_DSCPS = (HIGH_DSCP, 34, 26)  # EF, AF41, AF31: urgent levels, heaviest jobs first
MAX_URGENT_LEVELS = len(URGENT_DSCPS)
# urgent levels + bulk + background -> queues, highest first: clear of 3 and 4 (lossless on SONiC/QFX);
# a switch target moves the top class from 7 (network control's) to 6.
TENANT_QUEUES = {3: (7, 5, 0), 4: (7, 5, 2, 0), 5: (7, 5, 2, 1, 0)}
URGENT, BULK, BACKGROUND = "urgent", "bulk", "background"
_TENANTS_KEYS = {"name", "background_percent", "rate", "ports", "tenant", "description"}
_TENANT_KEYS = {"name", "weight"}


@dataclass(frozen=True)
class Tenant:
    """One job on the fabric; `weight` is how much GPU time it loses per byte delayed, relative to the others."""

    name: str
    weight: float = 1.0


@dataclass(frozen=True)
class Tenants:
    """The jobs sharing a fabric and the background class's guaranteed share (percent)."""

    name: str
    tenants: tuple[Tenant, ...]
    background_percent: int = BACKGROUND_PERCENT
    rate: int | None = None
    ports: tuple[str, ...] = ()

    def levels(self) -> list[float]:
        """The distinct job weights, heaviest first: one urgent level each."""
        return sorted({t.weight for t in self.tenants}, reverse=True)

    def by_name(self, name: str) -> Tenant:
        for tenant in self.tenants:
            if tenant.name == name:
                return tenant
        raise QosProfileError(f"tenants {self.name!r} has no tenant {name!r}; its tenants: "
                              f"{', '.join(t.name for t in self.tenants)}")


def urgent_name(level: int, levels: int) -> str:
    return URGENT if levels == 1 else f"{URGENT}{level + 1}"


def check_tenants(tenants: Tenants) -> Tenants:
    """Names unique, weights positive, at most MAX_URGENT_LEVELS distinct weights, background 1..50%."""
    if not tenants.tenants:
        raise QosProfileError(f"tenants {tenants.name!r} lists no [[tenant]]: give one table per job")
    names = [t.name for t in tenants.tenants]
    for tenant in tenants.tenants:
        if not isinstance(tenant.name, str) or not tenant.name:
            raise QosProfileError(f"a tenant of {tenants.name!r} has no name: give each [[tenant]] a name")
        if names.count(tenant.name) > 1:
            raise QosProfileError(f"tenant {tenant.name!r} is listed twice in {tenants.name!r}")
        weight = tenant.weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise QosProfileError(f"weight {weight!r} of tenant {tenant.name!r} must be a positive number "
                                  "(GPU time lost per byte delayed, relative to the other jobs)")
    if len(tenants.levels()) > MAX_URGENT_LEVELS:
        raise QosProfileError(
            f"tenants {tenants.name!r} has {len(tenants.levels())} different job weights but the fabric has "
            f"room for {MAX_URGENT_LEVELS} urgent levels (8 queues less network control's and the two "
            "lossless ones): give jobs of similar weight the same weight")
    percent = tenants.background_percent
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 50:
        raise QosProfileError(f"background_percent {percent!r} of {tenants.name!r} must be a whole number "
                              "from 1 to 50 (the background class's guaranteed share of the link)")
    return tenants


def tenant_profile(tenants: Tenants) -> QosProfile:
    """The fabric classes as a QosProfile: urgent level(s), bulk (default), background."""
    check_tenants(tenants)
    levels = tenants.levels()
    queues = TENANT_QUEUES[len(levels) + 2]
    background = tenants.background_percent
    rest = 100 - background
    classes = [QosClass(urgent_name(0, len(levels)), (URGENT_DSCPS[0],), queues[0], STRICT)]
    lower = levels[1:]
    bulk = rest // 2 if lower else rest  # lower urgent levels share the other half by job weight
    for index, weight in enumerate(lower, start=1):
        share = max(1, round((rest - bulk) * weight / sum(lower)))
        classes.append(QosClass(urgent_name(index, len(levels)), (URGENT_DSCPS[index],), queues[index],
                                WEIGHTED, share))
    classes.append(QosClass(BULK, (LOW_DSCP,), queues[-2], WEIGHTED, bulk))
    classes.append(QosClass(BACKGROUND, (BACKGROUND_DSCP,), queues[-1], WEIGHTED, background,
                            min_share=background))
    return validate_profile(QosProfile(tenants.name, tuple(classes), BULK, tenants.rate, tenants.ports))


def tenant_classes(tenants: Tenants, name: str) -> tuple[PriorityClass, ...]:
    """A job's two classes on the fabric: high on its urgent level's DSCP, low on bulk's."""
    tenant = tenants.by_name(name)
    level = tenants.levels().index(tenant.weight)
    return (PriorityClass("high", URGENT_DSCPS[level]), PriorityClass("low", LOW_DSCP))


def tenant_class_spec(tenants: Tenants, name: str) -> str:
    """`tenant_classes` in the `--classes` syntax ('high:46,low:0')."""
    return format_classes(tenant_classes(tenants, name))


def tenants_from_dict(data: dict, default_name: str = "tenants", source: str = "tenants") -> Tenants:
    """Build Tenants from parsed TOML (see the module docstring for the keys)."""
    refuse_unknown_keys(data, _TENANTS_KEYS, f"{source}:")
    entries = data.get("tenant")
    if not isinstance(entries, list) or not entries:
        raise QosProfileError(f"{source}: no [[tenant]] tables; give one per job sharing the fabric")
    tenants = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry:
            raise QosProfileError(f"{source}: tenant #{index + 1} needs a name")
        refuse_unknown_keys(entry, _TENANT_KEYS, f"{source}: tenant #{index + 1} has")
        tenants.append(Tenant(entry["name"], entry.get("weight", 1.0)))
    rate, ports = fabric_rate_and_ports(data, source)
    return check_tenants(Tenants(data.get("name", default_name), tuple(tenants),
                                 data.get("background_percent", BACKGROUND_PERCENT),
                                 rate, ports))


def is_tenants_file(data: dict) -> bool:
    """A parsed TOML file is a tenants file when it has [[tenant]] tables."""
    return "tenant" in data


def load_tenants(path: "str | Path") -> Tenants:
    """Read and validate a tenants TOML file; QosProfileError says what is wrong."""
    path = Path(path)
    data = read_toml(path, "tenants file")
    return tenants_from_dict(data, default_name=path.stem, source=str(path))
