"""The sweep's yardstick: one candidate's time from its probes, and how sure the sweep is of it.

    estimate(kept, "trimmed")                      # a candidate's seconds per iteration
    interval(blocks, "trimmed")                    # (low, high): 95% bootstrap interval of it
    ratio_interval(blocks_of, chosen, among, ...)  # the sweep ratio's interval, P(within 3%)

A candidate's iterations come in probes (blocks of consecutive kept iterations after a switch);
iterations inside a probe are not independent (a burst of load from elsewhere slows several, the
workers' phase carries over from one iteration to the next), so the intervals resample whole
probes, not single iterations.

Statistics (`STATISTICS`): "median" (the sweep's before; robust, but on ResNet-50's iterations,
a mix of compute-only and network-bound ones, it wastes data: standard error 1.6% over 100
iterations in probes of 10 where the mean has 1.1%), "mean" (training's throughput; a GC pause or
a load burst moves it), and "trimmed" (the mean of the middle 80%: 1.25% there, and a few
outliers at either end do not move it). docs/threshold-search.md has the measurements.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import trim_mean

TRIM = 0.1   # share cut from each end by the "trimmed" statistic


def _trimmed(values) -> float:
    return float(trim_mean(np.asarray(values, dtype=float), TRIM))


STATISTICS = {"median": lambda v: float(np.median(v)), "mean": lambda v: float(np.mean(v)), "trimmed": _trimmed}
CONFIDENCE = 0.95
RESAMPLES = 1000


def estimate(values, statistic: str = "median") -> float:
    """A candidate's seconds per iteration from its kept iterations."""
    try:
        return STATISTICS[statistic](values)
    except KeyError:
        from geryon.errors import ConfigError

        raise ConfigError(f"sweep statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}") from None


def _resampled(blocks: list[list[float]], statistic: str, rng, resamples: int) -> np.ndarray:
    """`resamples` bootstrap replicates of the statistic, drawing whole probes with replacement."""
    blocks = [np.asarray(b, dtype=float) for b in blocks if len(b)]
    picks = rng.integers(0, len(blocks), size=(resamples, len(blocks)))
    return np.array([estimate(np.concatenate([blocks[i] for i in row]), statistic) for row in picks])


def interval(blocks: list[list[float]], statistic: str = "median", seed: int = 0,
             resamples: int = RESAMPLES, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile bootstrap interval of a candidate's estimate (None-free: one probe gives a point)."""
    replicates = _resampled(blocks, statistic, np.random.default_rng(seed), resamples)
    tail = (1 - confidence) / 2
    return float(np.quantile(replicates, tail)), float(np.quantile(replicates, 1 - tail))


def ratio_interval(blocks_of: dict, chosen, among, statistic: str = "median", seed: int = 0,
                   resamples: int = RESAMPLES, confidence: float = CONFIDENCE, within: float = 1.03) -> dict:
    """How sure the sweep is that chosen / best <= `within`, best being the minimum over `among`.

    Every candidate in `among` (and the chosen one) is resampled by probes at once; each replicate's
    ratio is its estimate at `chosen` over its smallest estimate. Returns the interval of the ratio
    (`low`, `high`) and `within_share`: the share of replicates with ratio <= `within`.
    """
    rng = np.random.default_rng(seed)
    keys = list(dict.fromkeys([*among, chosen]))
    replicates = {key: _resampled(blocks_of[key], statistic, rng, resamples) for key in keys}
    best = np.min(np.vstack([replicates[key] for key in among]), axis=0)
    ratios = replicates[chosen] / best
    tail = (1 - confidence) / 2
    return {"low": float(np.quantile(ratios, tail)), "high": float(np.quantile(ratios, 1 - tail)),
            "within_share": float(np.mean(ratios <= within)), "confidence": confidence}
