"""`geryon report threshold RUN.json`: a PNG of what the search tried and a Markdown summary.

The PNG (matplotlib, Agg backend) shows every kept iteration time per candidate (dots), each
probe's median (round one and the refining round in different markers), the fitted curve, the chosen
threshold and, when the record has one, the exhaustive sweep. The Markdown summary lists the
classes at the chosen threshold (tensors and bytes per class), the time per candidate, the chosen
value and the expected saving against no priority (t = 0 or 1: one class) and against the worst
candidate tried. Everything comes from the RUN.json record (`runrecord.py`).

Three classes (two thresholds t1 < t2): the PNG is a heat-map of the Gaussian process's mean
iteration time over every (t1, t2) pair (`surface` in RUN.json) with the probes on top, and the
summary compares the chosen pair with the best two-class split on the surface's edge (t1 = 0 or
t2 = 1 leave a class empty: those pairs are two-class splits), i.e. whether a third class helps.
"""

from pathlib import Path

import numpy as np

from geryon.categorize.classes import threshold_split
from geryon.categorize.fit import ThresholdFit
from geryon.categorize.runrecord import load_run
from geryon.categorize.urgency import RankedParameter


def render_threshold_report(run_path, out_dir=None) -> tuple[Path, Path]:
    """Write threshold.png and threshold.md next to RUN.json (or into out_dir); return both paths."""
    run_path = Path(run_path)
    record = load_run(run_path)
    out = Path(out_dir) if out_dir else run_path.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = run_path.stem if run_path.stem != "RUN" else "threshold"
    png, md = out / f"{stem}.png", out / f"{stem}.md"
    plot_threshold_run(record, png)
    md.write_text(summarize_threshold_run(record, png.name))
    return png, md


def thresholds_of(probe: dict) -> list[float]:
    return list(probe["thresholds"]) if "thresholds" in probe else [probe["threshold"]]


def classes_of(record: dict) -> int:
    return int(record["settings"].get("classes", 2))


def plot_threshold_run(record: dict, path) -> None:
    if classes_of(record) == 3 and record.get("surface"):
        return plot_surface(record, path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fit = ThresholdFit.from_data(record["fit"]) if record.get("fit") else None
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    sweep = record.get("sweep")
    if sweep:
        xs = [p["threshold"] for p in sweep]
        ax.plot(xs, [p["iter_s"] * 1e3 for p in sweep], color="0.6", marker="x", linestyle=":",
                linewidth=1, label="exhaustive sweep (median)")
        if all("true_iter_s" in p for p in sweep):
            ax.plot(xs, [p["true_iter_s"] * 1e3 for p in sweep], color="0.8", linewidth=1,
                    label="model without noise")
    for round_number, marker, color in ROUNDS:
        probes = [p for p in record["probes"] if p.get("round", 1) == round_number]
        if not probes:
            continue
        for p in probes:
            kept = np.asarray(p["kept"]) * 1e3
            ax.scatter([p["threshold"]] * len(kept), kept, s=8, color=color, alpha=0.35, linewidths=0)
        ax.scatter([p["threshold"] for p in probes], [p["median_s"] * 1e3 for p in probes], s=42,
                   marker=marker, color=color, edgecolors="black", linewidths=0.6, zorder=3,
                   label=f"{ROUND_NAMES[round_number]} (median; dots: iterations)")
    if fit:
        grid = np.linspace(min(fit.nodes), max(fit.nodes), 400)
        ax.plot(grid, fit.predict(grid) * 1e3, color="tab:green", linewidth=2, label="fit (robust)")
    chosen = record.get("chosen")
    if chosen is not None:
        ax.axvline(chosen, color="tab:red", linestyle="--", linewidth=1.5,
                   label=f"chosen t = {chosen:g}" + (f" ({fit.minimum_s * 1e3:.1f} ms fitted)" if fit else ""))
    medians = [p["median_s"] * 1e3 for p in record["probes"]]
    low, high = min(medians), max(medians)
    if sweep:
        low = min(low, min(p["iter_s"] * 1e3 for p in sweep))
        high = max(high, max(p["iter_s"] * 1e3 for p in sweep))
    pad = (high - low) * 0.15 + 1e-3 * high
    ax.set_ylim(low - pad, high + pad)  # outlier iterations beyond this are clipped, on purpose
    context = record.get("context", {})
    ax.set_xlim(-0.03, 1.03)
    ax.set_xlabel(f"threshold t (fraction of the urgency order by {context.get('metric', 'position')})")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(f"Threshold search: {context.get('model', 'model')}, {describe_ranks(record)}, "
                 f"{len(record['probes'])} probes")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


NOTICEABLE = 0.005  # a fitted difference smaller than this is not called a win
ROUNDS = ((1, "o", "tab:blue"), (2, "s", "tab:orange"), (3, "D", "tab:purple"))
ROUND_NAMES = {1: "round 1: spread out", 2: "round 2: refining", 3: "round 3: best two re-measured"}


def plot_surface(record: dict, path) -> None:
    """Three classes: heat-map of the fitted time over (t1, t2), the probes, the chosen pair."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    surface = record["surface"]
    axis = np.asarray(surface["axis"], dtype=float)
    grid = np.array([[np.nan if v is None else v * 1e3 for v in row] for row in surface["mean_s"]])
    fig, ax = plt.subplots(figsize=(7.2, 6), dpi=120)
    step = float(np.min(np.diff(axis))) if axis.size > 1 else 0.05
    edges = np.concatenate([axis - step / 2, [axis[-1] + step / 2]])
    # rows of the grid are t1, columns t2: draw t1 on x, t2 on y
    mesh = ax.pcolormesh(edges, edges, grid.T, cmap="viridis", shading="flat")
    bar = fig.colorbar(mesh, ax=ax, label="fitted iteration time (ms, Gaussian-process mean)")
    bar.formatter.set_useOffset(False)  # a flat surface shows its (tiny) range, not an offset
    bar.update_ticks()
    for round_number, marker, color in ROUNDS:
        probes = [p for p in record["probes"] if p.get("round", 1) == round_number]
        if probes:
            ax.scatter([thresholds_of(p)[0] for p in probes], [thresholds_of(p)[1] for p in probes],
                       marker=marker, s=46, color=color, edgecolors="white", linewidths=0.8, zorder=3,
                       label=ROUND_NAMES[round_number])
    chosen = record.get("chosen_thresholds") or record.get("chosen")
    if chosen:
        ax.scatter([chosen[0]], [chosen[1]], marker="*", s=260, color="tab:red", edgecolors="white",
                   zorder=4, label=f"chosen ({chosen[0]:g}, {chosen[1]:g})")
    ax.set_xlim(edges[0], edges[-1])
    ax.set_ylim(edges[0], edges[-1])
    metric = record.get("context", {}).get("metric", "position")
    ax.set_xlabel(f"t1: class 0 | class 1 boundary (by {metric})")
    ax.set_ylabel(f"t2: class 1 | class 2 boundary (by {metric})")
    ax.set_title(f"3-class search: {record.get('context', {}).get('model', 'model')}, {describe_ranks(record)}, "
                 f"{len(record['probes'])} probes")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def two_class_edge(record: dict) -> tuple[float, float, float] | None:
    """The best two-class split on a three-class surface: (threshold, fitted seconds, its (t1, t2))."""
    surface = record.get("surface")
    if not surface:
        return None
    axis, grid = surface["axis"], surface["mean_s"]
    best = None
    for i, t1 in enumerate(axis):
        for j, t2 in enumerate(axis):
            value = grid[i][j]
            if value is None or not (t1 == axis[0] or t2 == axis[-1]):
                continue
            # (0, t2) puts nothing in class 0: a two-class split at t2; (t1, 1) one at t1
            split = t2 if t1 == axis[0] else t1
            if best is None or value < best[1]:
                best = (split, value, (t1, t2))
    return best


def describe_ranks(record: dict) -> str:
    """Who ran the iterations: a bench's recorded workers (and servers), else the reducing ranks.

    A bench drives its workers from one process, so its `world_size` (ranks that reduced the
    times) is 1; the workers it measured are in the context.
    """
    context = record.get("context", {})
    if "workers" not in context:
        return _counted(record.get("world_size", 1), "rank")
    ranks = _counted(context["workers"], "worker")
    if context.get("servers"):
        ranks += ", " + _counted(context["servers"], "server")
    return ranks


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def _classes_at(record: dict, thresholds):
    context = record.get("context", {})
    tensors = context.get("tensors")
    if not tensors:
        return None
    ranking = [RankedParameter(name=t["name"], layer=t.get("layer", t["name"]), module_type=t.get("type", ""),
                               numel=int(t["bytes"]) // 4, bytes=int(t["bytes"])) for t in tensors]
    return threshold_split(ranking, thresholds, metric=context.get("metric", "position"))


def fitted_values(record: dict) -> dict[tuple, float]:
    """The model's seconds per iteration at each tried point (tuples of thresholds)."""
    model = record.get("model") or {}
    if "points" in model and "mean" in model:
        return {tuple(float(t) for t in p): float(m) for p, m in zip(model["points"], model["mean"])}
    if record.get("fit"):
        fit = ThresholdFit.from_data(record["fit"])
        return {(t,): v for t, v in zip(fit.nodes, fit.values)}
    return {}


def _label(point) -> str:
    return ", ".join(f"{t:g}" for t in point)


def summarize_threshold_run(record: dict, png_name: str | None = None) -> str:
    """The Markdown summary of a RUN.json record."""
    context, settings, extra = record.get("context", {}), record["settings"], record.get("extra", {})
    fit = ThresholdFit.from_data(record["fit"]) if record.get("fit") else None
    fitted = fitted_values(record)
    classes = classes_of(record)
    chosen = tuple(record.get("chosen_thresholds") or [record["chosen"]])
    chosen_s = record.get("chosen_fitted_s") or (fit.minimum_s if fit else None) or fitted.get(chosen)
    method = (record.get("model") or {}).get("method") or (fit.method if fit else None)
    noun = "threshold" if classes == 2 else "thresholds"
    lines = [f"# Threshold search: {context.get('model', 'model')}" + (f", {classes} classes" if classes != 2 else ""),
             ""]
    if png_name:
        title = "iteration time vs threshold" if classes == 2 else "fitted iteration time over (t1, t2)"
        lines += [f"![{title}]({png_name})", ""]
    lines += [f"- ranks: {describe_ranks(record)}; metric: {context.get('metric', 'position')}; "
              f"backend: {context.get('backend', 'training')}",
              f"- probes: {len(record['probes'])} (budget {settings['budget']}, "
              f"first round {settings['first_round']}, last {settings.get('confirm', 0)} re-measuring the best two), "
              f"{settings['iters_per_probe']} iterations each, {settings['warmup']} discarded as warm-up",
              f"- model: {method}" if method else "- model: none",
              f"- **chosen {noun}: {_label(chosen)}**"
              + (f" (fitted {chosen_s * 1e3:.2f} ms per iteration)" if chosen_s else ""), ""]
    assignment = _classes_at(record, list(chosen))
    if assignment:
        total = sum(assignment.sizes) or 1
        lines += [f"## Classes at the chosen {noun}", "", "| class | tensors | bytes | share of bytes |",
                  "| --- | ---: | ---: | ---: |"]
        for cls, (count, size) in enumerate(zip(assignment.tensors_per_class(), assignment.bytes_per_class())):
            name = "0 (high)" if cls == 0 else (f"{cls} (low)" if cls == classes - 1 else f"{cls}")
            lines.append(f"| {name} | {count} | {size / 1e6:.2f} MB | {100 * size / total:.1f}% |")
        lines.append("")
    lines += ["## Time per candidate", "", f"| {noun} | round | iterations kept | median (ms) | fitted (ms) |",
              "| ---: | ---: | ---: | ---: | ---: |"]
    for p in sorted(record["probes"], key=lambda p: (thresholds_of(p), p.get("index", 0))):
        point = tuple(thresholds_of(p))
        fit_ms = f"{fitted[point] * 1e3:.2f}" if point in fitted else ""
        lines.append(f"| {_label(point)} | {p.get('round', 1)} | {len(p['kept'])} | "
                     f"{p['median_s'] * 1e3:.2f} | {fit_ms} |")
    lines.append("")
    lines += ["## Expected saving", ""]
    baseline = [fitted[(t,)] for t in (0.0, 1.0) if (t,) in fitted]
    if chosen_s and baseline:
        base = min(baseline)  # conservative when both t = 0 and t = 1 were measured
        lines.append(f"- vs no priority (t = 0 or 1, one class): {base * 1e3:.2f} → {chosen_s * 1e3:.2f} ms, "
                     f"{100 * (1 - chosen_s / base):.1f}% less time per iteration")
    if chosen_s and fitted:
        worst = max(fitted.values())
        lines.append(f"- vs the worst candidate tried: {worst * 1e3:.2f} → {chosen_s * 1e3:.2f} ms, "
                     f"{100 * (1 - chosen_s / worst):.1f}% less")
    edge = two_class_edge(record) if classes == 3 else None
    if chosen_s and edge:
        split, edge_s, _pair = edge
        verdict = ("3 classes beat 2" if chosen_s < (1 - NOTICEABLE) * edge_s else
                   "no difference between 3 and 2 classes beyond 0.5%" if chosen_s <= (1 + NOTICEABLE) * edge_s
                   else "3 classes do not beat 2")
        lines.append(f"- vs the best two-class split on the surface (t = {split:g}): {edge_s * 1e3:.2f} → "
                     f"{chosen_s * 1e3:.2f} ms, {100 * (1 - chosen_s / edge_s):+.1f}%: {verdict} here (fitted)")
    for key, name in (("no_priority_iter_s", "no priority (measured)"), ("coarse_iter_s", "coarse CONV/FC split"),
                      ("two_class_iter_s", "the two-class search's choice")):
        if key in extra and "chosen_iter_s" in extra:
            lines.append(f"- vs {name}: {extra[key] * 1e3:.2f} → {extra['chosen_iter_s'] * 1e3:.2f} ms, "
                         f"{100 * (1 - extra['chosen_iter_s'] / extra[key]):+.1f}% (re-measured)")
    if "sweep_best" in extra:
        lines += ["", "## Against the exhaustive sweep", "",
                  f"- sweep of {len(record.get('sweep') or [])} candidates: best t = {extra['sweep_best']:g} at "
                  f"{extra['sweep_best_iter_s'] * 1e3:.2f} ms",
                  f"- search ({extra.get('probes', len(record['probes']))} probes): t = {_label(chosen)}, "
                  f"re-measured {extra['chosen_iter_s'] * 1e3:.2f} ms "
                  f"({100 * (extra['chosen_iter_s'] / extra['sweep_best_iter_s'] - 1):+.1f}% vs the sweep's best)"]
        if "sweep_ratio" in extra:
            lines.append(f"- in the sweep itself: {100 * (extra['sweep_ratio'] - 1):+.1f}% at the chosen threshold "
                         "vs the sweep's best (both timed in the same sweep)")
        if "sweep_ratio_low" in extra:
            lines.append(f"- the sweep's race over {len(extra['sweep_contenders'])} contenders "
                         f"({extra['sweep_race_passes']} more passes, {extra['sweep_statistic']}): ratio 95% "
                         f"interval [{extra['sweep_ratio_low']:.3f}, {extra['sweep_ratio_high']:.3f}], within 3% "
                         f"in {100 * extra['sweep_within_share']:.0f}% of probe resamples")
        if "true_ratio" in extra:
            lines.append(f"- noise-free model: chosen {extra['true_chosen_iter_s'] * 1e3:.2f} ms vs best "
                         f"{extra['true_best_iter_s'] * 1e3:.2f} ms at t = {extra['true_best']:g} "
                         f"({100 * (extra['true_ratio'] - 1):+.1f}%)")
    return "\n".join(lines) + "\n"
