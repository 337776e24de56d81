"""Validate the simulator against measured rows of `geryon bench paper --json` (or its --out JSON).

A measured row gives model, link, policy, workers, layout and iteration_s, and the emulation's
scale: `time_scale` (paper compute = profile x time_scale; `compute_scale` is read too),
`bw_bits` (the paper-scale link rate), else `link_rate_bits` (the emulated port) with `size_scale`
and `wall_scale` (emulated seconds per paper second: link = link_rate_bits x wall_scale /
size_scale, iteration = iteration_s / wall_scale; its payload rate that of an emulated port, whose
HTB counts the Ethernet header but no preamble, FCS or gap: scenario.EMULATED_FRAME_BYTES).
`slice_params`, `placement`, `within_class` (default "fifo", what bench paper's roles do) and
`servers` are used when present, in the row or in the file's `settings` object (bench paper's
paper.json). Policy variants `+urgency`, `+fifo` and
`+bytes` are replayed; rows without iteration_s, or with a policy the simulator does not know (the
`control-nolimit` row, `+threshold`), are skipped and counted.

Each row is simulated with the exact per-connection model (<= 64 workers) twice, and once with
the aggregate model:
- `fluid_s`: the plain fluid model (instant fair shares, no TCP, no harness);
- `simulated_s`: the same model with the emulation's TCP effects (job.py, queues.py), each set from
  something measured apart from the row itself:
    socket backlog = the run's TCP_NOTSENT_LOWAT (settings.notsent_lowat, default 16 KiB) plus the
                     bytes a connection keeps in flight, `EMULATED_INFLIGHT` (queues.py), measured by
                     the same probe with as many connections into one port as the row's layout
                     brings together (`port_connections`: colocated, the 2(W-1) pushes into a
                     host's server and pulls into its worker);
    port queues    = `EMULATED_QUEUES` (queues.py), the standing queues `python -m
                     geryon.sim.queueprobe` measured on emulated ports of this congestion control
                     and rate (none for an unmeasured one: that row says so);
    frame latency  = half the harness's own cost per iteration, measured by the file's control row
                     (same job, no bandwidth limit: `harness_s` = its iteration_s - its compute_s,
                     same model and congestion control): the iteration boundary's critical chain,
                     the last push and the first pull, is two frames;
    compute        = the row's measured compute-only iteration (`compute_s`, one replayed worker
                     without network), which differs from profile x time_scale by the replay's
                     own overheads (about 1-2%).
- `aggregate_s`: `simulated_s`'s settings in the aggregate model (what scales to 1024 workers).
All sizes scale with the row's size_scale (emulated bytes -> paper bytes).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from geryon.errors import ConfigError
from geryon.sim.paper import LINKS
from geryon.sim.job import EXACT_LIMIT
from geryon.sim.queues import emulated_inflight, emulated_queues
from geryon.sim.scenario import EMULATED_FRAME_BYTES, SimSetting, simulate
from geryon.sim.workload import WITHIN_CLASS
from geryon.transport.policy import POLICIES

# `bench paper` starts its replayed roles without --within-class: replay_roles' default "fifo"
# (urgency 0 for every tensor), so its endhost and geryon order a send queue by class, then arrival
BENCH_WITHIN_CLASS = "fifo"
BENCH_NOTSENT_LOWAT = 16384   # bytes: bench paper's TCP_NOTSENT_LOWAT where a record does not say


def read_record(path):
    """A bench's JSON record: the file as one JSON value, else its JSON lines as a list (other lines,
    such as a bench's progress, skipped)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is neither JSON nor JSON lines: {exc}") from None


def load_rows(path) -> list[dict]:
    """Rows from a JSON array, an object with "rows", or JSON lines."""
    data = read_record(path)
    if isinstance(data, dict):
        settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
        data = data.get("rows", [data])
        if isinstance(data, list):
            data = [{**{k: settings[k] for k in ("slice_params", "placement", "wall_scale",
                                                  "size_scale", "notsent_lowat", "pull") if k in settings},
                     **row}
                    if isinstance(row, dict) else row for row in data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ConfigError(f"{path}: expected a list of row objects (bench paper --json)")
    return data


def setting_for(row: dict, base: SimSetting) -> SimSetting:
    """The simulated setting that replays one measured row."""
    size_scale = float(row.get("size_scale") or 1.0)
    wall_scale = float(row.get("wall_scale") or 1.0)
    time_scale = float(row.get("time_scale") or row.get("compute_scale") or base.compute_scale)
    # a row measured on an emulated port (bench paper's rows carry its rate beside the paper-scale one):
    # its HTB counts the Ethernet header only
    frame_bytes = EMULATED_FRAME_BYTES if row.get("link_rate_bits") else base.frame_bytes
    if row.get("bw_bits"):
        bits = float(row["bw_bits"])
    elif row.get("link_rate_bits"):
        bits = float(row["link_rate_bits"]) * wall_scale / size_scale
    else:
        bits = LINKS.get(str(row.get("link", "")).lower(), base.bw_bps)
    placement = row.get("placement") if row.get("placement") in ("count", "bytes") else base.placement
    within = row.get("within_class") if row.get("within_class") in WITHIN_CLASS else BENCH_WITHIN_CLASS
    return replace(base, model=str(row["model"]).lower(), link=row.get("link"), bw_bps=bits,
                   workers=int(row.get("workers", base.workers)),
                   servers=int(row["servers"]) if row.get("servers") else None,
                   layout=str(row.get("layout", base.layout)), compute_scale=time_scale,
                   slice_params=int(row.get("slice_params") or base.slice_params),
                   placement=placement, within_class=within, frame_bytes=frame_bytes,
                   pull_ahead=row.get("pull", "end") == "ahead")


def measured_compute_scale(row: dict, setting: SimSetting) -> float:
    """The compute scale at which the profile takes the row's measured compute-only iteration
    (`compute_s`: one replayed worker, no network), else the row's own scale."""
    if not row.get("compute_s"):
        return setting.compute_scale
    profile = setting.profile()
    total = sum(layer.forward_ns + layer.backward_ns for layer in profile.layers) * 1e-9
    return float(row["compute_s"]) / float(row.get("wall_scale") or 1.0) / total


# bench paper's policy variants the simulator can replay (policy+option, geryon/bench/paper.py)
VARIANT_OPTIONS = {"urgency": {"within_class": "urgency"}, "fifo": {"within_class": "fifo"},
                   "bytes": {"placement": "bytes"}}


def variant(name) -> tuple[str | None, dict]:
    """("geryon", {...}) for "geryon+urgency"; (None, {}) for what the simulator cannot replay."""
    base, *options = str(name or "").split("+")
    if base not in POLICIES or any(o not in VARIANT_OPTIONS for o in options):
        return None, {}
    settings = {}
    for option in options:
        settings.update(VARIANT_OPTIONS[option])
    return base, settings


def port_connections(setting: SimSetting) -> int:
    """Remote connections that meet in one host's down link in the row's layout: colocated, the
    pushes into its server and the pulls into its worker (2(W-1)); separate, the larger of a
    server's pushes (W) and a worker's pulls (servers)."""
    if setting.layout == "colocated":
        return max(1, 2 * (setting.workers - 1))
    return max(setting.workers, setting.server_count)


def emulated_tcp(setting: SimSetting, port_bps: float, size_scale: float, congestion: str = "bbr",
                 notsent_lowat: float = BENCH_NOTSENT_LOWAT) -> tuple[dict, list[str]]:
    """The socket backlog and port queues (paper bytes) of `setting` emulated on `port_bps` ports with
    bytes x `size_scale`, from the measured tables (queues.py); and what was not measured."""
    table = emulated_queues(congestion, port_bps)
    inflight = emulated_inflight(congestion, port_bps, port_connections(setting))
    fields = {"backlog_bytes": (notsent_lowat + (inflight or 0.0)) / size_scale,
              "queues": table.scaled(1.0 / size_scale) if table is not None else None}
    notes = [] if table is not None else [f"no measured queues for {congestion}"]
    if inflight is None:
        notes.append(f"no measured bytes in flight for {congestion}")
    return fields, notes


def tcp_effects(row: dict, setting: SimSetting, harness_s: float | None) -> dict:
    """The TCP/harness fields of SimSetting for a measured row (see the module doc), and a note."""
    size_scale = float(row.get("size_scale") or 1.0)
    wall_scale = float(row.get("wall_scale") or 1.0)
    port_bits = setting.bw_bps * size_scale / wall_scale       # the emulated port's rate
    fields, notes = emulated_tcp(setting, port_bits, size_scale, row.get("congestion") or "bbr",
                                 float(row.get("notsent_lowat") or BENCH_NOTSENT_LOWAT))
    fields.update(compute_scale=measured_compute_scale(row, setting), latency_s=max(0.0, harness_s or 0.0) / 2)
    if harness_s is None:
        notes.append("no control row: no frame latency")
    return fields, "; ".join(notes)


def compare(rows: list[dict], base: SimSetting) -> tuple[list[dict], int]:
    """Per measured row: simulated iteration times (fluid, with TCP) and errors; and how many were skipped."""
    out, skipped = [], 0
    harness = {}
    for row in rows:
        if row.get("policy") == "control-nolimit" and row.get("iteration_s") and row.get("compute_s"):
            harness[(str(row.get("model", "")).lower(), row.get("congestion"))] = (
                float(row["iteration_s"]) - float(row["compute_s"])) / float(row.get("wall_scale") or 1.0)
    for row in rows:
        policy, options = variant(row.get("policy"))
        if policy is None or not row.get("iteration_s") or not row.get("model"):
            skipped += 1
            continue
        setting = replace(setting_for(row, base), **options)
        harness_s = harness.get((setting.model, row.get("congestion")))
        effects, note = tcp_effects(row, setting, harness_s)
        # the per-connection model where it is cheap: emulated clusters are small, and the
        # aggregate's lock-step workers miss vanilla's asymmetry (the worker beside a big
        # tensor's server moves it through memory while the others wait)
        exact = replace(setting, exact=True) if setting.workers <= EXACT_LIMIT else setting
        fluid = simulate(exact, policy)
        sim = simulate(replace(exact, **effects), policy)
        aggregate = simulate(replace(setting, exact=False, **effects), policy)
        measured = float(row["iteration_s"]) / float(row.get("wall_scale") or 1.0)
        out.append({"model": setting.model, "link": row.get("link"), "policy": row["policy"],
                    "congestion": row.get("congestion"),
                    "workers": setting.workers, "layout": setting.layout,
                    "time_scale": setting.compute_scale, "size_scale": row.get("size_scale"),
                    "measured_s": measured, "simulated_s": sim["iteration_s"],
                    "error": sim["iteration_s"] / measured - 1,
                    "fluid_s": fluid["iteration_s"], "fluid_error": fluid["iteration_s"] / measured - 1,
                    "analytic_s": fluid["analytic_iteration_s"],
                    "analytic_error": fluid["analytic_iteration_s"] / measured - 1,
                    "aggregate_s": aggregate["iteration_s"],
                    "aggregate_error": aggregate["iteration_s"] / measured - 1, "exact": exact.exact,
                    "harness_s": harness_s, "latency_s": effects["latency_s"],
                    "backlog_bytes": effects["backlog_bytes"], "note": note})
    return out, skipped


def summary(results: list[dict]) -> str:
    """Per row, then mean and worst |error| per policy and per worker count."""
    lines = ["model     link   policy   workers layout     cc     measured s  simulated s  error   "
             "fluid s  fluid err  aggregate err  analytic err"]
    for r in results:
        lines.append(f"{r['model']:9} {str(r.get('link') or '-'):6} {r['policy']:8} {r['workers']:7} {r['layout']:10} "
                     f"{str(r.get('congestion') or '-'):6} "
                     f"{r['measured_s']:10.3f}  {r['simulated_s']:11.3f}  {100 * r['error']:+5.1f}%  "
                     f"{r['fluid_s']:7.3f}  {100 * r['fluid_error']:+7.1f}%  "
                     f"{100 * r['aggregate_error']:+11.1f}%  "
                     f"{100 * r['analytic_error']:+10.1f}%" + (f"  ({r['note']})" if r.get("note") else ""))
    for key in ("policy", "workers", "link", "congestion"):
        for label, field in (("|error|", "error"), ("|fluid error|", "fluid_error"),
                             ("|aggregate error|", "aggregate_error")):
            groups = defaultdict(list)
            for r in results:
                groups[r[key]].append(abs(r[field]))
            lines.append(f"mean {label} per {key}: " + ", ".join(
                f"{k}: {100 * sum(v) / len(v):.1f}% (max {100 * max(v):.1f}%, n={len(v)})"
                for k, v in sorted(groups.items(), key=lambda kv: str(kv[0]))))
    if results:
        worst = max(results, key=lambda r: abs(r["error"]))
        lines.append(f"worst |error|: {100 * worst['error']:+.1f}% ({worst['policy']}, "
                     f"{worst['workers']} workers, {worst.get('link')})")
    return "\n".join(lines)
