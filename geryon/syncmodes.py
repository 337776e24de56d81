"""What `--sync` and `--straggler` ask for, parsed once for the launcher and the ranks.

`--sync full` is allreduce mode's synchronous averaging of every gradient; `--sync partial[:P]` and
`--sync partial-static[:P]` are Ripples' partial allreduce (geryon.runtime.partial_sync: groups of P
workers average their models after local steps). `--straggler RANK:FACTOR` makes one worker FACTOR
times slower (geryon.runtime.straggler), to reproduce a slow worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from geryon.errors import ConfigError

SYNC_MODES = ("full", "partial", "partial-static")
DEFAULT_GROUP_SIZE = 4


@dataclass(frozen=True)
class SyncChoice:
    """What `--sync` asked for: "full" (allreduce), "partial" or "partial-static", and P."""
    kind: str = "full"
    group_size: int = DEFAULT_GROUP_SIZE

    @property
    def partial(self) -> bool:
        return self.kind != "full"

    def text(self) -> str:
        return self.kind if not self.partial else f"{self.kind}:{self.group_size}"


def parse_sync(text: str | None) -> SyncChoice:
    """'full', 'partial[:P]' or 'partial-static[:P]' (P >= 2)."""
    text = (text or "full").strip()
    kind, _, size = text.partition(":")
    if kind not in SYNC_MODES or (kind == "full" and size):
        raise ConfigError(f"--sync {text!r}: use full, partial[:P] or partial-static[:P] (P workers per group)")
    if not size:
        return SyncChoice(kind)
    try:
        group_size = int(size)
    except ValueError:
        group_size = 0
    if group_size < 2:
        raise ConfigError(f"--sync {text!r}: a group has at least 2 workers (e.g. {kind}:{DEFAULT_GROUP_SIZE})")
    return SyncChoice(kind, group_size)


@dataclass(frozen=True)
class Straggler:
    rank: int
    factor: float

    def text(self) -> str:
        return f"{self.rank}:{self.factor:g}"


def parse_straggler(text: str | None, workers: int | None = None) -> Straggler | None:
    """'RANK:FACTOR' (FACTOR >= 1) or empty (None)."""
    text = (text or "").strip()
    if not text:
        return None
    rank, _, factor = text.partition(":")
    try:
        parsed = Straggler(int(rank), float(factor))
    except ValueError:
        raise ConfigError(f"--straggler {text!r}: use RANK:FACTOR, e.g. 7:5 makes worker 7 five times "
                          "slower") from None
    if parsed.factor < 1 or parsed.rank < 0 or (workers is not None and parsed.rank >= workers):
        highest = workers - 1 if workers is not None else "N-1"
        raise ConfigError(f"--straggler {text!r}: RANK is a worker (0..{highest}) and FACTOR at least 1")
    return parsed
