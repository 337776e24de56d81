"""`--priority search` inside a running job: time every iteration, search the threshold, switch classes.

Every worker builds one `TrainingSearch` on the model's first forward call (from the urgency
ranking) and calls `iteration_done()` after each optimizer step. An iteration's time is the wall
time between the ends of two successive steps (the first one runs from the setup to the first step).
The times feed geryon.categorize's `ThresholdSearch`, whose collective at the end of every probe
goes through the job's TCPStore (`StoreReducer`): every rank posts its times, rank 0 reduces,
fits and decides, every rank reads the same decision. So every rank learns the next threshold
after the same iteration; `iteration_done()` then returns the new class assignment (checked by
digest against every other rank through the store) and the caller applies it before the next
iteration starts: allreduce mode swaps the bucket priorities (geryon.runtime.ddp_sync), ps mode
drains, leaves the servers and joins them again with the new classes (geryon.runtime.ps_sync and
geryon.runtime.server). Once the search is done its chosen threshold stays for the rest of training;
rank 0 writes the RUN.json (geryon.categorize.runrecord; `geryon report threshold RUN.json`).

Settings (rank 0's environment, handed to every rank through the store; defaults are
SearchSettings', measured in geryon.categorize.search):
  GERYON_SEARCH_CANDIDATES   comma-separated thresholds in [0, 1] (default 0, 0.05, ..., 1)
  GERYON_SEARCH_ITERS        iterations per probe (default 5)
  GERYON_SEARCH_WARMUP       of those, discarded at the start of each probe (default 1)
  GERYON_SEARCH_BUDGET       probes in all (default 10)
  GERYON_SEARCH_FIRST_ROUND  evenly spaced probes before refining (default 6)
  GERYON_SEARCH_CLASSES      K: search K−1 thresholds (default 2; the launcher's --max-classes K sets it;
                             the transport needs at least K classes, --classes)
  GERYON_SEARCH_METHOD       fit (robust spline, two classes) or gp (Gaussian process; default for K > 2)
  GERYON_SEARCH_CONFIRM      last probes re-measuring the best two (default 2)
  GERYON_SEARCH_RUN          where rank 0 writes RUN.json (default: next to --timeline FILE as
                             FILE's stem + `.RUN.json`, else `RUN.json` in the working directory)
"""

import atexit
import json
import logging
import sys
import time
from pathlib import Path

from geryon.categorize.classes import Assignment, threshold_split
from geryon.categorize.runrecord import write_run
from geryon.categorize.search import SearchSettings, ThresholdSearch
from geryon import envvars
from geryon.errors import ConfigError
from geryon.runtime.env import RankEnv
from geryon.runtime.priorities import agree_on_assignment

log = logging.getLogger(__name__)

SETTING_VARIABLES = dict(zip(envvars.SEARCH_VARIABLES,
                             ("candidates", "iters_per_probe", "warmup", "budget", "first_round", "classes",
                              "method", "confirm")))
SEARCH_KEY = "search/"


def search_settings(env: RankEnv) -> SearchSettings:
    """SearchSettings from the rank's search variables (unset ones keep their defaults)."""
    values = {}
    for variable, text in env.search:
        name = SETTING_VARIABLES[variable]
        try:
            if name == "candidates":
                values[name] = tuple(float(item) for item in text.split(",") if item.strip())
            elif name == "method":
                values[name] = text
            else:
                values[name] = int(text)
        except ValueError:
            kind = "comma-separated numbers" if name == "candidates" else "a whole number"
            raise ConfigError(f"{variable}={text!r}: expected {kind}") from None
    try:
        return SearchSettings(**values)
    except ConfigError as exc:
        raise ConfigError(f"{envvars.PREFIX}SEARCH_* settings: {exc}") from None


def run_record_path(env: RankEnv) -> Path:
    """Where rank 0 writes the search's RUN.json (see the module docstring)."""
    if env.search_run:
        return Path(env.search_run)
    if env.timeline:
        timeline = Path(env.timeline)
        return timeline.with_name(timeline.stem + ".RUN.json")
    return Path.cwd() / "RUN.json"


class StoreReducer:
    """The search's collective over the job's TCPStore: rank 0 decides on everyone's times."""

    def __init__(self, store, prefix: str, rank: int, world_size: int):
        self.store, self.prefix = store, prefix
        self.rank, self.world_size = rank, world_size
        self._round = 0

    def decide(self, local_times: list[float], decide_fn) -> dict:
        base = f"{self.prefix}round/{self._round}/"
        self._round += 1
        self.store.set(f"{base}times/{self.rank}", json.dumps([float(t) for t in local_times]))
        if self.rank == 0:
            everyone = [json.loads(self.store.get(f"{base}times/{r}")) for r in range(self.world_size)]
            self.store.set(base + "decision", json.dumps(decide_fn(everyone), default=float))
        return json.loads(self.store.get(base + "decision"))


class TrainingSearch:
    """One worker's view of the search: the current assignment, and when to switch it."""

    def __init__(self, ranking, max_classes: int, store, prefix: str, job: RankEnv,
                 context: dict | None = None):
        self.ranking, self.max_classes = list(ranking), max_classes
        self.store, self.prefix = store, prefix + SEARCH_KEY
        self.job, self.rank, self.world_size = job, job.rank, job.world_size
        tensors = [{"name": p.name, "layer": p.layer, "type": p.module_type, "bytes": p.bytes}
                   for p in self.ranking]
        self.search = ThresholdSearch(self._agreed_settings(),
                                      StoreReducer(store, self.prefix, job.rank, job.world_size),
                                      {"metric": "position", "tensors": tensors, **(context or {})})
        classes = self.search.settings.classes
        if max_classes is not None and classes > max_classes:
            raise ConfigError(f"the search was asked for {classes} classes ({envvars.SEARCH_CLASSES}) but the "
                              f"transport has {max_classes}; launch with --classes {classes} (or more)")
        self.iteration = 0          # the iteration now running (0-based optimizer steps)
        self.switches: list[dict] = []
        self.thresholds = self.search.thresholds_for(0)
        self.assignment = self._agree(self.thresholds, 0)
        self.run_path: Path | None = None
        self._started = time.monotonic()
        atexit.register(self._note_if_unfinished)

    def _note_if_unfinished(self) -> None:
        if self.rank == 0 and self.iteration and not self.search.done:
            settings = self.search.settings
            print(f"geryon: the threshold search did not finish: training ended after {self.iteration} "
                  f"iterations, the search needs up to {settings.budget * settings.iters_per_probe} "
                  f"({envvars.SEARCH_BUDGET} x {envvars.SEARCH_ITERS}); no RUN.json written",
                  file=sys.stderr, flush=True)

    def _agreed_settings(self) -> SearchSettings:
        """Rank 0's settings on every rank (an SSH host may not see the launcher's search variables)."""
        key = self.prefix + "settings"
        if self.rank == 0:
            self.store.set(key, json.dumps(search_settings(self.job).to_data()))
        data = json.loads(self.store.get(key))
        data["candidates"] = tuple(data["candidates"])
        return SearchSettings(**data)

    @property
    def switch_count(self) -> int:
        return len(self.switches)

    def iteration_done(self) -> Assignment | None:
        """Record the iteration that just ended; the new assignment if the next one trains with another."""
        ended = time.monotonic()
        finished = self.iteration
        self.search.record(finished, ended - self._started)
        self.iteration += 1
        thresholds = self.search.thresholds_for(self.iteration)
        changed = None
        if thresholds != self.thresholds:
            self.thresholds = thresholds
            self.assignment = self._agree(thresholds, len(self.switches) + 1)
            self.switches.append({"iteration": self.iteration, "thresholds": list(thresholds),
                                  **({"threshold": thresholds[0]} if len(thresholds) == 1 else {}),
                                  "digest": self.assignment.digest()})
            print(f"geryon: search switch {len(self.switches)} before iteration {self.iteration}: "
                  f"threshold {_label(thresholds)}, {self.assignment.bytes_per_class()} bytes per class "
                  f"(digest {self.assignment.digest()[:12]})", file=sys.stderr, flush=True)
            changed = self.assignment
        if self.search.done and self.run_path is None:
            self._finish()
        self._started = time.monotonic()  # the switch itself counts toward the next (warm-up) iteration
        return changed

    @property
    def threshold(self) -> float:
        """Two classes: the threshold now in use."""
        return self.thresholds[0]

    def _agree(self, thresholds, switch: int) -> Assignment:
        assignment = threshold_split(self.ranking, list(thresholds), max_classes=self.max_classes)
        agree_on_assignment(self.store, f"{self.prefix}switch/{switch}/", self.rank, self.world_size,
                            assignment)
        return assignment

    def _finish(self) -> None:
        self.run_path = run_record_path(self.job)
        if self.rank != 0:
            return
        record = self.search.to_record(extra={"switches": self.switches,
                                              "chosen_from_iteration": self.iteration})
        try:
            write_run(self.run_path, record)
            where = f"; RUN.json: {self.run_path} (geryon report threshold {self.run_path})"
        except OSError as exc:
            where = f"; could not write {self.run_path}: {exc}"
        print(f"geryon: threshold search done after {self.iteration} iterations: chosen threshold "
              f"{_label(self.search.chosen_point)} (fitted {record['chosen_fitted_s'] or 0:.4f} s per iteration), "
              f"kept for the rest of training{where}", file=sys.stderr, flush=True)


def _label(thresholds) -> str:
    return ",".join(f"{t:.4g}" for t in thresholds)
