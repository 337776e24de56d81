"""Plots of an analysis: per-class wire occupancy over an iteration; urgent waits by trace."""

from __future__ import annotations

from pathlib import Path

from geryon.analyze.metrics import Analysis


def occupancy_plot(analysis: Analysis, path: Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3), dpi=90)
    for cls, row in sorted(analysis.occupancy.items()):
        xs = [1e3 * analysis.occupancy_round * (i + 0.5) / len(row) for i in range(len(row))]
        ax.plot(xs, row, label=f"class {cls}", color=f"C{cls}")
    ax.set_xlabel("time in the (median) iteration, ms")
    ax.set_ylabel("frames on the wire")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def wait_plot(analyses: dict[str, Analysis], path: Path, cls: int = 0) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label for label, a in analyses.items() if a.waits.get(cls)]
    fig, ax = plt.subplots(figsize=(5, 3), dpi=90)
    ax.boxplot([[1e3 * w for w in analyses[label].waits[cls]] for label in labels], showfliers=False)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel(f"class {cls} frame: queue + wire, ms")
    ax.set_title("urgent-tensor wait by trace", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
