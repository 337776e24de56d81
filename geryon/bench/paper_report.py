"""The outputs of `geryon bench paper`: the Markdown table beside the paper's, and the PNG chart."""

from __future__ import annotations

from geryon.bench.paper_math import CONTROL


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _num(value, fmt: str = ".3f") -> str:
    return "–" if value is None else format(value, fmt)


def _of_cores(row: dict) -> str:
    cores = row.get("cpu_machine_cores")
    return f"of the {cores} cores" if cores else "cores"


def markdown_report(record: dict) -> str:
    """The scaling table (measured vs paper, error per cell), control row, calibration, slicing table."""
    lines = ["# geryon bench paper", ""]
    calibration = record.get("calibration")
    if calibration:
        lines.append(f"Compute scale calibrated on {' '.join(calibration['cell'])} "
                     f"(target {_pct(calibration['target'])}): **{calibration['compute_scale']:.3f}** "
                     f"x the profiled GPU times, in {len(calibration['probes'])} probe(s).")
    else:
        lines.append(f"Compute scale given: **{record['compute_scale']:.3f}** x the profiled GPU times.")
    if record.get("settings", {}).get("mode") == "allreduce":
        lines += ["", "Mode: **allreduce** (a ring of the workers, DDP's buckets in backward order; `+overlap`: "
                  "the next forward waits per layer for its own parameters, else for every bucket). The paper "
                  "measured PS only, so these cells have no paper figure."]
    lines += ["", f"Scaling: {record.get('scaling_note', '')}.", ""]
    lines += ["| model | link | congestion | policy | iteration s (IQR) | images/s | speedup vs vanilla "
              "| scaling efficiency | paper | error (points) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in record["rows"]:
        error = "–" if row.get("error_points") is None else f"{row['error_points']:+.1f}"
        lines.append(f"| {row['model']} | {row['link']} | {row['congestion']} | {row['policy']} | "
                     f"{row['iteration_s']:.3f} ({row['iteration_spread']:.3f}) | {row['images_per_s']:.1f} | "
                     f"{_num(row.get('speedup_vs_vanilla'), '.2f')} | {_pct(row['scaling_efficiency'])} | "
                     f"{_pct(row.get('paper_scaling_efficiency'))} | {error} |")
    controls = [r for r in record["rows"] if r["policy"] == CONTROL]
    for row in controls:
        lines.append("")
        lines.append(f"Control ({row['model']}, {row['congestion']}, {row.get('control_of')} with ports at "
                     f"{row['link_rate_bits'] / 1e9:g} Gbit/s, i.e. no bandwidth limit): "
                     f"{_pct(row['scaling_efficiency'])} scaling efficiency (target >= 97%); role processes "
                     f"used {row.get('cpu_roles_cores', 0):.2f} {_of_cores(row)}, the machine was "
                     f"{100 * (row.get('cpu_machine_share') or 0):.0f}% busy.")
    if record.get("slicing_rows"):
        lines += ["", "## Slice size (VGG-19, 10GbE): geryon vs endhost", "",
                  "| params/slice | congestion | geryon images/s | endhost images/s | geryon/endhost | "
                  "paper geryon | paper TicTac | paper ratio |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        by_key = {}
        for row in record["slicing_rows"]:
            by_key.setdefault((row["slice_params"], row["congestion"]), {})[row["policy"]] = row
        for (params, congestion), pair in by_key.items():
            g, e = pair.get("geryon"), pair.get("endhost")
            if not g or not e:
                continue
            lines.append(f"| {params // 1024}K | {congestion} | {g['images_per_s']:.1f} | {e['images_per_s']:.1f} | "
                         f"{e['iteration_s'] / g['iteration_s']:.3f} | {_num(g.get('paper_images_per_s'), '.1f')} | "
                         f"{_num(e.get('paper_images_per_s'), '.1f')} | "
                         f"{_num(g.get('paper_geryon_over_endhost'), '.3f')} |")
    lines += ["", f"Wall time of the run: {record.get('wall_s', 0):.0f} s.", ""]
    return "\n".join(lines)


def plot_paper(record: dict, path) -> None:
    """Bars: measured scaling efficiency per (model, link, congestion) and policy; paper figures as ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in record["rows"] if r["policy"] != CONTROL]
    groups = []
    for row in rows:
        key = (row["model"], row["link"], row["congestion"])
        if key not in groups:
            groups.append(key)
    policies = []
    for row in rows:
        if row["policy"] not in policies:
            policies.append(row["policy"])
    width = 0.8 / max(1, len(policies))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) + 2), 4.5))
    for p_index, policy in enumerate(policies):
        xs, ys, paper_x, paper_y = [], [], [], []
        for g_index, key in enumerate(groups):
            match = [r for r in rows if (r["model"], r["link"], r["congestion"]) == key and r["policy"] == policy]
            if not match:
                continue
            x = g_index + (p_index - (len(policies) - 1) / 2) * width
            xs.append(x)
            ys.append(100 * match[0]["scaling_efficiency"])
            if match[0].get("paper_scaling_efficiency") is not None:
                paper_x.append(x)
                paper_y.append(100 * match[0]["paper_scaling_efficiency"])
        ax.bar(xs, ys, width, label=policy)
        ax.scatter(paper_x, paper_y, marker="_", s=300, color="black", zorder=3,
                   label="paper" if p_index == 0 else None)
    for row in record["rows"]:
        if row["policy"] == CONTROL:
            ax.axhline(100 * row["scaling_efficiency"], color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([" ".join(k) for k in groups], fontsize=8)
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"{record['rows'][0]['workers'] if record['rows'] else ''} workers, compute scale "
                 f"{record['compute_scale']:.2f}; ticks: paper, dotted: no-limit control", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
