"""RUN.json: the record of one threshold search, the source of truth for `geryon report threshold`.

Schema `geryon.threshold-run/1` (one JSON object; times in seconds per iteration):

    schema        "geryon.threshold-run/1"
    context       {"model": str, "metric": "position"|"bytes", "classes": K (2 unless a K-class search),
                   "tensors": [{"name", "layer", "type", "bytes"}, ...] in urgency order,
                   "bandwidth_bps"?, "backend"?, ...}   -- what was searched; free-form extras allowed
    settings      SearchSettings: {"candidates": [t...], "budget", "first_round", "iters_per_probe",
                   "warmup", "smoothing", "start_iteration", "classes", "method": "gp"|"fit", "confirm",
                   "kappa"}
    world_size    number of ranks whose times were reduced
    probes        [{"index", "round": 1|2|3 (spread out, refining, re-measuring the best two),
                    "thresholds": [K−1 thresholds], "threshold" (two classes only), "first_iteration",
                    "times": [[s per iteration] per rank], "reduced": [max over ranks per iteration],
                    "kept": [reduced minus warm-up], "median_s"}]  in the order tried
    fit           {"method", "nodes": [t], "values": [fitted s], "medians": [raw median s],
                   "noise_scale", "smoothing", "minimum", "minimum_s"}   (fit.ThresholdFit; two classes:
                   for method gp its values are the Gaussian process's mean at the tried thresholds)
    model         the last model's data: fit.ThresholdFit's, or surrogate.Surrogate's (points, medians,
                   mean, sd, kernel)
    surface       null, or (three classes) {"axis": [t...], "mean_s": [[s or null per t2] per t1],
                   "sd_s": ...}: the Gaussian process's mean over every (t1 < t2) pair, for the heat-map
    chosen        the threshold kept for the rest of training (three or more classes: the list)
    chosen_thresholds  the K−1 chosen thresholds, always a list
    chosen_fitted_s  the model's seconds per iteration at `chosen`
    sweep         null, or [{"threshold", "iter_s", "times": [s...]}] -- every candidate measured the
                   same way (the exhaustive comparison)
    extra         free-form results of the run that produced it, e.g. a bench's "chosen_iter_s",
                   "sweep_best", "sweep_best_iter_s", "probes", "true_iter_s" (analytic backend)
"""

import json
from pathlib import Path

from geryon.errors import ConfigError

SCHEMA = "geryon.threshold-run/1"
REQUIRED = ("schema", "settings", "probes", "fit", "chosen")


def write_run(path, record: dict) -> Path:
    """Write a RUN.json record (validated first); `path` may be a directory: DIR/RUN.json then."""
    check_run(record, str(path))
    path = Path(path)
    if path.is_dir():
        path = path / "RUN.json"         # `--out DIR` as for the other benches: never lose a finished run
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def load_run(path) -> dict:
    """Read and validate a RUN.json record."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not a JSON file: {exc}") from None
    check_run(record, str(path))
    return record


def check_run(record, where: str = "RUN.json") -> None:
    """Raise ConfigError unless `record` follows the schema above (the parts a report needs)."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: not a JSON object")
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)} (schema in geryon/categorize/runrecord.py)")
    if record["schema"] != SCHEMA:
        raise ConfigError(f"{where}: schema is {record['schema']!r}, expected {SCHEMA!r}")
    probes = record["probes"]
    if not isinstance(probes, list) or not probes:
        raise ConfigError(f"{where}: 'probes' must be a non-empty list")
    for probe in probes:
        if not isinstance(probe, dict) or not ("threshold" in probe or "thresholds" in probe) \
                or "kept" not in probe:
            raise ConfigError(f"{where}: every probe needs 'thresholds' and 'kept' (written on rank 0)")
    sweep = record.get("sweep")
    if sweep is not None and not (isinstance(sweep, list)
                                  and all(isinstance(p, dict) and "threshold" in p and "iter_s" in p
                                          for p in sweep)):
        raise ConfigError(f"{where}: 'sweep' must be null or a list of {{threshold, iter_s}}")
