"""Which collectives carry allreduce mode's gradient buckets (`--collectives`), and how each marks them.

    geryon        geryon's own ring allreduce over per-class TCP flows marked with each class's DSCP
                  (geryon.transport); the default.
    nccl          one NCCL process group per priority class, each created with its own traffic class:
                  the class's DSCP << 2, the IP TOS byte of RoCE packets (geryon.runtime.class_groups).
    nccl-ib:S,... the same on InfiniBand: one service level (0-15) per class, most urgent class first.
    gloo-classes  one gloo process group per class. gloo cannot mark its packets (no TOS, DSCP or
                  SO_PRIORITY option), so the classes are separate connections, not separate queues.

The launcher (geryon.launch.config) validates the choice, a rank (geryon.runtime.class_groups) uses
it; both read it through `parse_collectives`, this module being the one home of the names.
"""

from dataclasses import dataclass

from geryon.errors import ConfigError

GERYON = "geryon"
NCCL = "nccl"
NCCL_IB = "nccl-ib"
GLOO_CLASSES = "gloo-classes"
CHOICES = (GERYON, NCCL, f"{NCCL_IB}:SL,...", GLOO_CLASSES)
MAX_SERVICE_LEVEL = 15   # InfiniBand service levels are 4 bits


@dataclass(frozen=True)
class Collectives:
    """A parsed --collectives choice."""

    kind: str                                # GERYON | NCCL | NCCL_IB | GLOO_CLASSES
    service_levels: tuple[int, ...] = ()     # nccl-ib: one per class, most urgent first

    @property
    def process_groups(self) -> bool:
        """Buckets go through torch.distributed groups, one per class (everything but geryon's transport)."""
        return self.kind != GERYON

    @property
    def backend(self) -> str | None:
        """The torch.distributed backend of the per-class groups; None for geryon's transport."""
        if self.kind in (NCCL, NCCL_IB):
            return "nccl"
        return "gloo" if self.kind == GLOO_CLASSES else None

    def text(self) -> str:
        """The canonical spelling (what the launcher hands to ranks)."""
        if self.kind == NCCL_IB:
            return f"{NCCL_IB}:{','.join(map(str, self.service_levels))}"
        return self.kind

    def traffic_classes(self, dscps: tuple[int, ...]) -> tuple[int | None, ...]:
        """The traffic class each class's group is created with, given the classes' DSCPs (None: unmarked).

        NCCL passes the one number to its IB/RoCE transport as both the GRH traffic class (RoCE: the
        IP TOS byte, DSCP << 2 with the ECN bits clear) and the service level.
        """
        if self.kind == NCCL:
            return tuple(d << 2 for d in dscps)
        if self.kind == NCCL_IB:
            check_class_count(self, len(dscps))
            return self.service_levels
        return tuple(None for _ in dscps)


def parse_collectives(text: str | None) -> Collectives:
    """Parse a --collectives value ('geryon' when empty); ConfigError says what is accepted."""
    value = (text or GERYON).strip()
    kind, sep, levels = value.partition(":")
    if kind == NCCL_IB:
        if not sep or not levels.strip():
            raise ConfigError(f"--collectives {value!r}: name one InfiniBand service level per priority "
                              f"class, most urgent first, e.g. {NCCL_IB}:3,0")
        try:
            numbers = tuple(int(item) for item in levels.split(","))
        except ValueError:
            raise ConfigError(f"--collectives {value!r}: service levels are whole numbers 0-"
                              f"{MAX_SERVICE_LEVEL}, e.g. {NCCL_IB}:3,0") from None
        if any(not 0 <= n <= MAX_SERVICE_LEVEL for n in numbers):
            raise ConfigError(f"--collectives {value!r}: InfiniBand service levels are 0-{MAX_SERVICE_LEVEL}")
        return Collectives(NCCL_IB, numbers)
    if sep or kind not in (GERYON, NCCL, GLOO_CLASSES):
        raise ConfigError(f"unknown --collectives {value!r}; choose one of {', '.join(CHOICES)}")
    return Collectives(kind)


def check_class_count(collectives: Collectives, classes: int) -> None:
    """nccl-ib names one service level per class: refuse a count that does not match."""
    if collectives.kind == NCCL_IB and len(collectives.service_levels) != classes:
        raise ConfigError(f"--collectives {collectives.text()} names {len(collectives.service_levels)} service "
                          f"levels but the job has {classes} priority classes; give one per class, most "
                          "urgent first")
