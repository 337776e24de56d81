"""Rows of a simulated table -> text table, Markdown, JSON lines and PNG charts.

Row fields are `bench paper`'s (model, link, policy, workers, layout, iteration_s, images_per_s,
speedup_vs_vanilla, scaling_efficiency, paper_scaling_efficiency) plus the simulator's own
(analytic_iteration_s, error_points: simulated minus paper efficiency in percentage points).
"""

from __future__ import annotations

import json
from pathlib import Path

from geryon.transport.policy import POLICIES


def add_derived(rows: list[dict]) -> list[dict]:
    """Fill speedup_vs_vanilla and error_points (per model, link, workers and layout)."""
    vanilla = {}
    for row in rows:
        if row["policy"] == "vanilla":
            vanilla[_cell(row)] = row["iteration_s"]
    for row in rows:
        base = vanilla.get(_cell(row))
        row["speedup_vs_vanilla"] = base / row["iteration_s"] if base else None
        paper = row.get("paper_scaling_efficiency")
        row["error_points"] = (100 * (row["scaling_efficiency"] - paper)) if paper is not None else None
    return rows


def _cell(row: dict) -> tuple:
    return (row["model"], row.get("link"), row.get("bw_gbit"), row["workers"], row["layout"],
            row.get("topology"), row.get("oversubscription"))


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


HEADER = ("model", "link", "policy", "workers", "layout", "iteration s", "analytic s", "images/s",
          "speedup", "efficiency", "paper", "error pts")


def table_cells(row: dict) -> tuple:
    link = row.get("link") or f"{row['bw_gbit']:g}G"
    return (row["model"], link, row["policy"], str(row["workers"]), row["layout"],
            f"{row['iteration_s']:.3f}", _num(row.get("analytic_iteration_s"), ".3f"),
            f"{row['images_per_s']:.1f}", _num(row.get("speedup_vs_vanilla"), ".2f") + "x",
            _pct(row["scaling_efficiency"]), _pct(row.get("paper_scaling_efficiency")),
            _num(row.get("error_points"), "+.1f"))


def text_table(rows: list[dict]) -> str:
    cells = [HEADER] + [table_cells(row) for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells)


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(table_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def json_lines(rows: list[dict]) -> str:
    return "\n".join(json.dumps(row, sort_keys=True) for row in rows)


def efficiency_chart(rows: list[dict], path: Path, title: str) -> Path:
    """Bars of simulated scaling efficiency per cell and policy, the paper's as black ticks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["model"], r.get("link") or f"{r['bw_gbit']:g}G") for r in rows})
    policies = [p for p in POLICIES if any(r["policy"] == p for r in rows)]
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(cells) + 2), 3.2), dpi=90)
    width = 0.8 / max(1, len(policies))
    for j, policy in enumerate(policies):
        for i, cell in enumerate(cells):
            row = next((r for r in rows if (r["model"], r.get("link") or f"{r['bw_gbit']:g}G") == cell
                        and r["policy"] == policy), None)
            if row is None:
                continue
            x = i + (j - (len(policies) - 1) / 2) * width
            ax.bar(x, 100 * row["scaling_efficiency"], width, color=f"C{j}",
                   label=policy if i == 0 else None)
            if row.get("paper_scaling_efficiency") is not None:
                ax.plot([x - width / 2, x + width / 2], [100 * row["paper_scaling_efficiency"]] * 2, "k-", lw=2)
    ax.set_xticks(range(len(cells)), [f"{m}\n{link}" for m, link in cells], fontsize=8)
    ax.set_ylabel("scaling efficiency %")
    ax.set_ylim(0, 105)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=len(policies), loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def line_chart(series: dict[str, tuple[list, list]], path: Path, title: str, xlabel: str, ylabel: str,
               logx: bool = False) -> Path:
    """One line per series name: (x values, y values)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=90)
    for i, (name, (xs, ys)) in enumerate(series.items()):
        ax.plot(xs, ys, marker="o", ms=3, color=f"C{i}", label=name)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
