"""Gaussian-process surrogate of iteration time over K−1 thresholds, for the search's decisions.

`fit_surrogate(samples)` takes the kept iteration times per tried point (a point is a tuple of
K−1 increasing thresholds; K = 2 is a 1-tuple) and returns a `Surrogate`: the posterior mean and
standard deviation of the iteration time at any point, by scikit-learn's
`GaussianProcessRegressor`.

Model (why each piece):
- One observation per distinct point: the *median* of its kept iterations (robust: a slow outlier
  iteration, a GC pause or a retransmission, moves a median by one rank, not by its size), with
  its own noise variance `alpha_i = (1.2533 s_i)^2 / n_i` (the variance of a median of n_i samples
  with spread s_i; s_i is 1.4826 × the median absolute deviation, floored at 0.3% of the median and
  pooled with the other points' spread so that a lucky quiet probe is not trusted blindly). Points
  measured twice (the final re-measure) simply have more samples and a smaller alpha.
- Kernel: constant × Matérn(ν = 3/2) + a small white-noise term. Matérn 3/2 allows the kinks and
  steep slopes of a threshold curve (a large tensor changing class) where an RBF would over-smooth;
  the length scale is fitted by maximum likelihood within [0.04, 2] (a grid step to flat) and the
  white term absorbs what the per-point alphas miss (drift between probes on a shared machine).
- Targets are normalised (divided by their median, centred) so the kernel bounds mean the same
  for a 30 ms and a 3 s iteration.

The search uses the surrogate two ways: to pick the next point (lower confidence bound
mean − κ·sd over untried candidates: low where it looks fast, or where it is still uncertain) and
to rank tried points for the final decision (posterior mean: a point is judged with its
neighbours' evidence, not on its own noisy median).
"""

from dataclasses import dataclass

import numpy as np

METHOD = "Gaussian process (scikit-learn, Matern 3/2 + white noise, per-point median variance)"
MIN_RELATIVE_SPREAD = 0.003


@dataclass
class Surrogate:
    """Posterior of seconds per iteration over threshold points (tuples of K−1 thresholds)."""

    points: list[tuple[float, ...]]   # distinct tried points
    medians: list[float]              # raw median per point (seconds)
    counts: list[int]                 # kept iterations per point
    spread: float                     # pooled robust spread of one iteration (seconds)
    kernel: str                       # the fitted kernel, as text
    _gp: object
    _scale: float
    _offset: float

    def predict(self, points) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sd) in seconds at each point."""
        from threadpoolctl import threadpool_limits

        x = np.atleast_2d(np.asarray(points, dtype=float))
        with threadpool_limits(1):
            mean, sd = self._gp.predict(x, return_std=True)
        return mean * self._scale + self._offset, sd * self._scale

    def ranked_tried(self) -> list[tuple[tuple[float, ...], float]]:
        """Tried points with their posterior mean, best first."""
        mean, _sd = self.predict(self.points)
        # A flat posterior (the spread between points no larger than the noise) ties every point: the
        # raw median then decides, not the order of the points.
        resolution = 1e-6 * max(abs(float(np.max(mean))), 1e-12)
        median = dict(zip(self.points, self.medians))
        return sorted(((p, float(m)) for p, m in zip(self.points, mean)),
                      key=lambda item: (round(item[1] / resolution), median[item[0]], item[0]))

    def to_data(self) -> dict:
        mean, sd = self.predict(self.points)
        return {"method": METHOD, "points": [list(p) for p in self.points], "medians": self.medians,
                "counts": self.counts, "spread": self.spread, "kernel": self.kernel,
                "mean": [float(m) for m in mean], "sd": [float(s) for s in sd]}


def robust_spread(values: np.ndarray) -> float:
    return 1.4826 * float(np.median(np.abs(values - np.median(values))))


def fit_surrogate(samples: dict, seed: int = 0) -> Surrogate:
    """Fit the GP to {point: [kept seconds...]}; see the module docstring."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    points = sorted(tuple(float(t) for t in p) for p, ys in samples.items() if len(ys))
    if not points:
        raise ValueError("no samples to fit")
    values = [np.asarray(samples[p], dtype=float) for p in points]
    medians = np.array([float(np.median(v)) for v in values])
    counts = np.array([v.size for v in values])
    scale = float(np.median(medians))
    floor = MIN_RELATIVE_SPREAD * scale
    pooled = float(np.median(np.concatenate([v - np.median(v) for v in values]) ** 2)) ** 0.5 * 1.4826
    spreads = np.array([max(robust_spread(v), floor) for v in values])
    # A probe's own spread from a handful of iterations is itself noisy: average it with the pooled one.
    spreads = np.sqrt((spreads ** 2 + max(pooled, floor) ** 2) / 2)
    alpha = (1.2533 * spreads) ** 2 / counts
    offset = float(np.mean(medians))
    y = (medians - offset) / scale
    x = np.asarray(points, dtype=float)
    kernel = (ConstantKernel(1e-3, (1e-7, 1.0)) * Matern(length_scale=0.2, length_scale_bounds=(0.04, 2.0), nu=1.5)
              + WhiteKernel(1e-5, (1e-9, 1e-2)))
    gp = GaussianProcessRegressor(kernel=kernel, alpha=alpha / scale ** 2, normalize_y=False,
                                  n_restarts_optimizer=0, random_state=seed)
    import warnings

    from threadpoolctl import threadpool_limits

    # a few points: one BLAS thread is fastest, and the training processes keep the other cores
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")  # bound warnings of the likelihood optimiser: harmless here
        gp.fit(x, y)
    return Surrogate(points=points, medians=[float(m) for m in medians], counts=[int(c) for c in counts],
                     spread=max(pooled, floor), kernel=str(gp.kernel_), _gp=gp, _scale=scale, _offset=offset)
