"""`geryon report threshold RUN.json`: a PNG of what the search tried and a Markdown summary.

The PNG (matplotlib, Agg backend) shows every kept iteration time per candidate (dots), each
probe's median (round one and the refining round in different markers), the fitted curve, the chosen
threshold and, when the record has one, the exhaustive sweep. The Markdown summary lists the
classes at the chosen threshold (tensors and bytes per class), the time per candidate, the chosen
value and the expected saving against no priority (t = 0 or 1: one class) and against the worst
candidate tried. Everything comes from the RUN.json record (`runrecord.py`).
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


def plot_threshold_run(record: dict, path) -> None:
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
    for round_number, marker, color in ((1, "o", "tab:blue"), (2, "s", "tab:orange")):
        probes = [p for p in record["probes"] if p.get("round", 1) == round_number]
        if not probes:
            continue
        for p in probes:
            kept = np.asarray(p["kept"]) * 1e3
            ax.scatter([p["threshold"]] * len(kept), kept, s=8, color=color, alpha=0.35, linewidths=0)
        ax.scatter([p["threshold"] for p in probes], [p["median_s"] * 1e3 for p in probes], s=42,
                   marker=marker, color=color, edgecolors="black", linewidths=0.6, zorder=3,
                   label=f"round {round_number} probes (median; dots: iterations)")
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


def _classes_at(record: dict, threshold: float):
    context = record.get("context", {})
    tensors = context.get("tensors")
    if not tensors:
        return None
    ranking = [RankedParameter(name=t["name"], layer=t.get("layer", t["name"]), module_type=t.get("type", ""),
                               numel=int(t["bytes"]) // 4, bytes=int(t["bytes"])) for t in tensors]
    return threshold_split(ranking, [threshold], metric=context.get("metric", "position"))


def summarize_threshold_run(record: dict, png_name: str | None = None) -> str:
    """The Markdown summary of a RUN.json record."""
    context, settings, extra = record.get("context", {}), record["settings"], record.get("extra", {})
    fit = ThresholdFit.from_data(record["fit"]) if record.get("fit") else None
    fitted = dict(zip(fit.nodes, fit.values)) if fit else {}
    chosen = record["chosen"]
    lines = [f"# Threshold search: {context.get('model', 'model')}", ""]
    if png_name:
        lines += [f"![iteration time vs threshold]({png_name})", ""]
    lines += [f"- ranks: {describe_ranks(record)}; metric: {context.get('metric', 'position')}; "
              f"backend: {context.get('backend', 'training')}",
              f"- probes: {len(record['probes'])} (budget {settings['budget']}, "
              f"first round {settings['first_round']}), "
              f"{settings['iters_per_probe']} iterations each, {settings['warmup']} discarded as warm-up",
              f"- fit: {fit.method}; noise scale {fit.noise_scale * 1e3:.2f} ms" if fit else "- fit: none",
              f"- **chosen threshold: {chosen:g}**"
              + (f" (fitted {fit.minimum_s * 1e3:.2f} ms per iteration)" if fit else ""), ""]
    assignment = _classes_at(record, chosen)
    if assignment:
        total = sum(assignment.sizes) or 1
        lines += ["## Classes at the chosen threshold", "", "| class | tensors | bytes | share of bytes |",
                  "| --- | ---: | ---: | ---: |"]
        for cls, (count, size) in enumerate(zip(assignment.tensors_per_class(), assignment.bytes_per_class())):
            name = "0 (high)" if cls == 0 else f"{cls} (low)"
            lines.append(f"| {name} | {count} | {size / 1e6:.2f} MB | {100 * size / total:.1f}% |")
        lines.append("")
    lines += ["## Time per candidate", "", "| threshold | round | iterations kept | median (ms) | fitted (ms) |",
              "| ---: | ---: | ---: | ---: | ---: |"]
    for p in sorted(record["probes"], key=lambda p: p["threshold"]):
        fit_ms = f"{fitted[p['threshold']] * 1e3:.2f}" if p["threshold"] in fitted else ""
        lines.append(f"| {p['threshold']:g} | {p.get('round', 1)} | {len(p['kept'])} | "
                     f"{p['median_s'] * 1e3:.2f} | {fit_ms} |")
    lines.append("")
    lines += ["## Expected saving", ""]
    chosen_s = fit.minimum_s if fit else None
    baseline = [fitted[t] for t in (0.0, 1.0) if t in fitted]
    if chosen_s and baseline:
        base = min(baseline)  # conservative when both t = 0 and t = 1 were measured
        lines.append(f"- vs no priority (t = 0 or 1, one class): {base * 1e3:.2f} → {chosen_s * 1e3:.2f} ms, "
                     f"{100 * (1 - chosen_s / base):.1f}% less time per iteration")
    if chosen_s and fitted:
        worst = max(fitted.values())
        lines.append(f"- vs the worst candidate tried: {worst * 1e3:.2f} → {chosen_s * 1e3:.2f} ms, "
                     f"{100 * (1 - chosen_s / worst):.1f}% less")
    if "sweep_best" in extra:
        lines += ["", "## Against the exhaustive sweep", "",
                  f"- sweep of {len(record.get('sweep') or [])} candidates: best t = {extra['sweep_best']:g} at "
                  f"{extra['sweep_best_iter_s'] * 1e3:.2f} ms",
                  f"- search ({extra.get('probes', len(record['probes']))} probes): t = {chosen:g}, "
                  f"re-measured {extra['chosen_iter_s'] * 1e3:.2f} ms "
                  f"({100 * (extra['chosen_iter_s'] / extra['sweep_best_iter_s'] - 1):+.1f}% vs the sweep's best)"]
        if "true_ratio" in extra:
            lines.append(f"- noise-free model: chosen {extra['true_chosen_iter_s'] * 1e3:.2f} ms vs best "
                         f"{extra['true_best_iter_s'] * 1e3:.2f} ms at t = {extra['true_best']:g} "
                         f"({100 * (extra['true_ratio'] - 1):+.1f}%)")
    return "\n".join(lines) + "\n"
