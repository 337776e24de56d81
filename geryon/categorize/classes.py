"""Priority classes: split an urgency ranking into K classes (0 = most urgent) as plain data.

Two ways to split, both over the ranking from `urgency.rank_parameters` or `LayerProfile.ranking`:

- `coarse_split`: the slides' coarse categorization. Everything ranked before the first
  fully-connected parameter (`nn.Linear`, Keras `Dense`) -- CONV layers and the other early layers
  (BatchNorm, embeddings, ...) -- is class 0; the first fully-connected parameter and everything
  after it is class 1.
- `threshold_split`: K classes from K−1 increasing thresholds t in [0, 1] over the urgency order.
  A tensor's *position* p is the fraction of the order before it; its class is the number of
  thresholds <= p. So t = 0 puts everything in the last class, t = 1 everything in class 0 (both
  are "no priority"), and 0.4, 0.7 make three classes.

Position metric (`metric`):
- "position" (default): p = index / number of tensors, the convention of the public Geryon fork
  (a fraction of the layer-ordered tensor list). Chosen as default because the search needs
  resolution where the decision is: a model's urgent, compute-heavy part is many small tensors
  (VGG-19: 16 of 19 layers but 14% of the bytes; ResNet-50: the FC layer is 8% of the bytes and
  1 of 107 profiled layers), so equal steps in t move roughly one layer each. Measured with the
  search on the analytic model (`search.py` docstring): under "bytes", VGG-19 at 40 Gbit/s ended
  >3% off the best candidate in 88-100% of runs, because its whole useful range (t < 0.14) falls
  between two first-round probes; under "position", in none (2% noise).
- "bytes": p = bytes before the tensor / total bytes, i.e. t is the share of traffic allowed into
  the higher class -- the physical quantity the network sees; useful to compare models.

An `Assignment` is serialisable (`to_json`/`from_json`) and has a `digest()`: the sha256 of its
canonical JSON, which every rank can compare before training with it.
"""

import hashlib
import json
from dataclasses import dataclass

from geryon.categorize.profiles import coarse_type
from geryon.categorize.urgency import RankedParameter
from geryon.errors import ClassSpecError

METRICS = ("position", "bytes")
DEFAULT_METRIC = "position"


@dataclass(frozen=True)
class Assignment:
    """Parameter name -> class index (0 = most urgent), with the order and sizes it was made from."""

    classes: int                  # K, the number of classes
    order: tuple[str, ...]        # parameter names in urgency order
    sizes: tuple[int, ...]        # bytes of each parameter, same order
    class_of: tuple[int, ...]     # class of each parameter, same order
    method: str                   # "coarse" or "threshold"
    thresholds: tuple[float, ...] = ()
    metric: str = DEFAULT_METRIC

    def as_dict(self) -> dict[str, int]:
        """The mapping a transport needs: parameter name -> class index."""
        return dict(zip(self.order, self.class_of))

    def __getitem__(self, name: str) -> int:
        return self.as_dict()[name]

    def bytes_per_class(self) -> list[int]:
        totals = [0] * self.classes
        for size, cls in zip(self.sizes, self.class_of):
            totals[cls] += size
        return totals

    def tensors_per_class(self) -> list[int]:
        counts = [0] * self.classes
        for cls in self.class_of:
            counts[cls] += 1
        return counts

    def to_data(self) -> dict:
        return {"classes": self.classes, "method": self.method, "metric": self.metric,
                "thresholds": list(self.thresholds),
                "parameters": [{"name": n, "bytes": b, "class": c}
                               for n, b, c in zip(self.order, self.sizes, self.class_of)]}

    @classmethod
    def from_data(cls, data: dict) -> "Assignment":
        try:
            params = data["parameters"]
            result = cls(classes=int(data["classes"]), order=tuple(p["name"] for p in params),
                         sizes=tuple(int(p["bytes"]) for p in params),
                         class_of=tuple(int(p["class"]) for p in params), method=str(data["method"]),
                         thresholds=tuple(float(t) for t in data.get("thresholds", ())),
                         metric=str(data.get("metric", DEFAULT_METRIC)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ClassSpecError(f"not an assignment: {exc!r}") from None
        if any(not 0 <= c < result.classes for c in result.class_of):
            raise ClassSpecError(f"assignment has a class outside 0..{result.classes - 1}")
        return result

    def to_json(self) -> str:
        return json.dumps(self.to_data(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Assignment":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ClassSpecError(f"assignment is not JSON: {exc}") from None
        return cls.from_data(data)

    def digest(self) -> str:
        """sha256 of the canonical JSON: equal on two ranks iff their assignments are equal."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def _check_classes(count: int, max_classes: int | None):
    if max_classes is not None and max_classes < 1:
        raise ClassSpecError(f"max_classes must be at least 1, got {max_classes}")
    if max_classes is not None and count > max_classes:
        raise ClassSpecError(f"{count} classes requested but the transport has only {max_classes}; "
                             f"use at most {max_classes - 1} thresholds")


def coarse_split(ranking: list[RankedParameter], max_classes: int | None = None) -> Assignment:
    """Two classes: everything before the first fully-connected parameter high, the rest low."""
    _check_classes(2, max_classes)
    first_fc = next((i for i, p in enumerate(ranking) if coarse_type(p.module_type) == "dense"),
                    len(ranking))
    return Assignment(classes=2, order=tuple(p.name for p in ranking), sizes=tuple(p.bytes for p in ranking),
                      class_of=tuple(0 if i < first_fc else 1 for i in range(len(ranking))),
                      method="coarse", metric="position")


def check_thresholds(thresholds) -> tuple[float, ...]:
    """Validate K−1 thresholds: each a number in [0, 1], strictly increasing."""
    values = []
    for t in thresholds:
        try:
            value = float(t)
        except (TypeError, ValueError):
            raise ClassSpecError(f"threshold {t!r} is not a number") from None
        if not 0.0 <= value <= 1.0:  # also rejects NaN
            raise ClassSpecError(f"threshold {t!r} is outside [0, 1]")
        values.append(value)
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ClassSpecError(f"thresholds {values} are not strictly increasing")
    return tuple(values)


def positions(ranking: list[RankedParameter], metric: str = DEFAULT_METRIC) -> list[float]:
    """Each tensor's position in [0, 1): the fraction of the order (tensors or bytes) before it."""
    if metric not in METRICS:
        raise ClassSpecError(f"unknown threshold metric {metric!r}; use one of {', '.join(METRICS)}")
    count = len(ranking)
    if metric == "position":
        return [i / count for i in range(count)]
    total = sum(p.bytes for p in ranking) or 1
    result, before = [], 0
    for p in ranking:
        result.append(before / total)
        before += p.bytes
    return result


def threshold_split(ranking: list[RankedParameter], thresholds, metric: str = DEFAULT_METRIC,
                    max_classes: int | None = None) -> Assignment:
    """K = len(thresholds) + 1 classes; a tensor's class is the number of thresholds <= its position."""
    values = check_thresholds(thresholds)
    _check_classes(len(values) + 1, max_classes)
    where = positions(ranking, metric)
    return Assignment(classes=len(values) + 1, order=tuple(p.name for p in ranking),
                      sizes=tuple(p.bytes for p in ranking),
                      class_of=tuple(sum(1 for t in values if t <= p) for p in where),
                      method="threshold", thresholds=values, metric=metric)


def equal_thresholds(classes: int) -> tuple[float, ...]:
    """K−1 evenly spaced thresholds (1/K, 2/K, ...): a neutral starting split for K classes."""
    if classes < 1:
        raise ClassSpecError(f"need at least one class, got {classes}")
    return tuple(i / classes for i in range(1, classes))
