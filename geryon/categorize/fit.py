"""Noise-tolerant fit of iteration time vs threshold, and its minimum among the tried thresholds.

Model: a robust, edge-preserving smoothing spline. The unknowns are the curve's values f_j at the
distinct tried thresholds t_j (linear in between). `scipy.optimize.least_squares(loss="soft_l1")`
minimises, with one robust loss over all residuals,
  - data residuals (y_i − f_{j(i)}) / s for every kept iteration time y_i, and
  - roughness residuals λ · (f_j − the line through f_{j−1} and f_{j+1}) / s at interior nodes
    (a second difference that does not grow when points get denser; λ has no unit).
Why this model: iteration time against a threshold is a step function (t only matters through
which tensors cross it) with cliffs where a large tensor changes class (VGG-19's fc1), so a global
quadratic misplaces the minimum next to a cliff, and a least-squares spline is dragged by a single
slow iteration (a GC pause, a retransmission). soft_l1 makes each residual count linearly beyond
the noise scale s, so an outlier iteration barely moves f_j, and a jump between neighbours costs
the penalty linearly rather than quadratically, so real cliffs survive the smoothing while noise
between neighbours is averaged away. s is estimated robustly (1.4826 × median absolute deviation
from each probe's median, at least 0.1% of the median time).

The choice is the tried threshold with the lowest fitted value: the fit ranks what was measured and
never extrapolates into an untried gap, where a cliff may hide.
"""

from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import least_squares

DEFAULT_SMOOTHING = 0.25
METHOD = "robust edge-preserving smoothing spline (scipy least_squares, loss=soft_l1)"


@dataclass(frozen=True)
class ThresholdFit:
    """Fitted iteration time at each tried threshold, and where the fitted minimum is."""

    nodes: tuple[float, ...]       # distinct tried thresholds, increasing
    values: tuple[float, ...]      # fitted seconds per iteration at each node
    medians: tuple[float, ...]     # raw median of the kept samples at each node
    noise_scale: float             # s, seconds
    smoothing: float               # λ
    minimum: float                 # node with the lowest fitted value
    minimum_s: float
    method: str = METHOD

    def predict(self, thresholds) -> np.ndarray:
        """The fitted curve (linear between nodes, constant outside), for plots."""
        return np.interp(np.asarray(thresholds, dtype=float), self.nodes, self.values)

    def to_data(self) -> dict:
        data = asdict(self)
        for key in ("nodes", "values", "medians"):
            data[key] = list(data[key])
        return data

    @classmethod
    def from_data(cls, data: dict) -> "ThresholdFit":
        fields = dict(data)
        for key in ("nodes", "values", "medians"):
            fields[key] = tuple(float(x) for x in fields[key])
        return cls(**fields)


def fit_threshold_curve(samples: dict[float, list[float]], smoothing: float = DEFAULT_SMOOTHING) -> ThresholdFit:
    """Fit seconds-per-iteration samples keyed by threshold; see the module docstring."""
    nodes = np.array(sorted(t for t, ys in samples.items() if len(ys)), dtype=float)
    if nodes.size == 0:
        raise ValueError("no samples to fit")
    data_node, data_y, medians = [], [], []
    for j, t in enumerate(nodes):
        ys = np.asarray(samples[float(t)], dtype=float)
        data_node.extend([j] * ys.size)
        data_y.extend(ys)
        medians.append(float(np.median(ys)))
    data_node, data_y, medians = np.array(data_node), np.array(data_y), np.array(medians)
    deviations = np.abs(data_y - medians[data_node])
    scale = max(1.4826 * float(np.median(deviations)), 1e-3 * float(np.median(data_y)), 1e-12)
    if nodes.size >= 3:
        h_left, h_right = np.diff(nodes)[:-1], np.diff(nodes)[1:]

        def roughness(f):
            # How far f_j sticks out of the line through its neighbours (= h^2 f''/2 when evenly spaced).
            line = (f[:-2] * h_right + f[2:] * h_left) / (h_left + h_right)
            return smoothing * (f[1:-1] - line) / scale
    else:
        def roughness(f):
            return np.zeros(0)

    def residuals(f):
        return np.concatenate([(data_y - f[data_node]) / scale, roughness(f)])

    result = least_squares(residuals, medians.copy(), loss="soft_l1", f_scale=1.0, method="trf")
    values = result.x
    best = int(np.argmin(values))
    return ThresholdFit(nodes=tuple(float(t) for t in nodes), values=tuple(float(v) for v in values),
                        medians=tuple(float(m) for m in medians), noise_scale=scale,
                        smoothing=float(smoothing), minimum=float(nodes[best]), minimum_s=float(values[best]))
