"""Pool the issue's 100 Mbit/s rows over every run of the current allreduce (twelfth session's
own-chunk chain onward): per row, how often each target was met, and all single collectives pooled.
With a path, also plot every single collective of each system against the ring line-rate bound.
Later runs are added by name (the stem of their .jsonl here); the seventeenth session's table is the
run without them. With --only, just the runs named (the twenty-second session's code on its own).

    python docs/data/linerate/lead17-pooled.py [--only] [LATER_RUN ...] [docs/img/linerate-pooled-100mbit.png]
"""
import json
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).parent
RUNS = [f"lead12-allreduce-100mbit-{r}" for r in "ijmn"] + [f"lead13-allreduce-100mbit-{r}" for r in "op"] \
    + ["lead14-allreduce-100mbit-q"] + [f"lead16-allreduce-100mbit-{r}" for r in "abc"] \
    + [f"lead17-allreduce-100mbit-{r}" for r in "abcd"]
if "--only" in sys.argv:
    RUNS = []
RUNS += [arg for arg in sys.argv[1:] if not arg.endswith(".png") and arg != "--only"]
PLOT_PATH = next((arg for arg in sys.argv[1:] if arg.endswith(".png")), None)

rows: dict[tuple[int, int], list[dict]] = {}
for run in RUNS:
    for line in (HERE / f"{run}.jsonl").read_text().splitlines():
        record = json.loads(line)
        rows.setdefault((record["workers"], record["size_bytes"]), []).append(record | {"run": run})

both_every_row = {run: True for run in RUNS}
print(f"{len(RUNS)} runs; per row: medians of 3 (the issue's form), then every single collective pooled")
print("row          <=1.0x gloo  <=1.05x bound  ratio vs gloo (min-median-max)   pooled geryon / gloo / plain TCP, s")
for (workers, size), records in sorted(rows.items()):
    gloo_ok = sum(r["ratio_vs_gloo"] <= 1.0 for r in records)
    bound_ok = sum(r["ratio_vs_line_rate"] <= 1.05 for r in records)
    for r in records:
        both_every_row[r["run"]] &= r["ratio_vs_gloo"] <= 1.0 and r["ratio_vs_line_rate"] <= 1.05
    ratios = sorted(r["ratio_vs_gloo"] for r in records)
    pooled = [statistics.median(x for r in records for x in r[key])
              for key in ("all_seconds", "gloo_all_seconds", "wire_ring_all_seconds") if all(key in r for r in records)]
    print(f"{workers} x {size / 1e6:>3.0f} MB   {gloo_ok:>2} of {len(records)}     "
          f"{bound_ok:>2} of {len(records)}       "
          f"{ratios[0]:.4f} {statistics.median(ratios):.4f} {ratios[-1]:.4f}        "
          + " / ".join(f"{p:.4f}" for p in pooled))
missed_runs = [run for run, ok in both_every_row.items() if not ok]
print(f"both targets in every row of a run: {sum(both_every_row.values())} of {len(RUNS)} runs "
      f"(missed: {', '.join(missed_runs) or 'none'})")


def chance_of_passing(draws: int = 20000, seed: int = 0) -> None:
    """How often a run in the issue's form (median of 3 per system) meets both targets in a row, and in
    all four rows, if each collective were an independent draw from that row's pooled collectives
    (runs on differently loaded machines pooled alike). And a one-sided Mann-Whitney U test per row:
    are geryon's collectives shorter than gloo's?"""
    import numpy as np
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(seed)
    every_row = np.ones(draws, dtype=bool)
    print("if collectives were independent draws: P(median of 3 meets the target) per row")
    for (workers, size), records in sorted(rows.items()):
        mine = np.array([x for r in records for x in r["all_seconds"]])
        gloo = np.array([x for r in records for x in r["gloo_all_seconds"]])
        bound = records[0]["line_rate_seconds"]
        ours = np.median(rng.choice(mine, (draws, 3)), axis=1)
        theirs = np.median(rng.choice(gloo, (draws, 3)), axis=1)
        vs_gloo, vs_bound = ours <= theirs, ours <= 1.05 * bound
        every_row &= vs_gloo & vs_bound
        p_value = mannwhitneyu(mine, gloo, alternative="less").pvalue
        print(f"{workers} x {size / 1e6:>3.0f} MB   <=1.0x gloo {vs_gloo.mean():.3f}   <=1.05x bound "
              f"{vs_bound.mean():.3f}   Mann-Whitney geryon < gloo: p = {p_value:.1e}")
    print(f"a whole run meeting both targets in every row: {every_row.mean():.3f}")


chance_of_passing()


def plot(path: str) -> None:
    """One panel per row: each system's single collectives / the bound, every run's medians marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = (("all_seconds", "geryon", "tab:blue"), ("gloo_all_seconds", "gloo", "tab:orange"),
               ("wire_ring_all_seconds", "plain TCP", "tab:gray"))
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 4.2), sharey=True)
    for ax, ((workers, size), records) in zip(axes, sorted(rows.items())):
        for position, (key, name, colour) in enumerate(systems):
            values = [x / r["line_rate_seconds"] for r in records for x in r[key]]
            jitter = [position + 0.25 * ((i * 0.618) % 1 - 0.5) for i in range(len(values))]
            ax.scatter(jitter, values, s=9, alpha=0.6, color=colour, label=name)
        ax.axhline(1.05, color="tab:red", linewidth=1, linestyle="--", label="1.05x the bound")
        ax.axhline(records[0]["header_floor_vs_line_rate"], color="black", linewidth=0.8, linestyle=":",
                   label="TCP/IP header floor")
        ax.set_xticks(range(len(systems)), [name for _, name, _ in systems])
        ax.set_title(f"{workers} ranks x {size / 1e6:.0f} MB")
        ax.set_ylim(1.040, 1.070)
    axes[0].set_ylabel("single collective / ring line-rate bound")
    axes[-1].legend(loc="upper right", fontsize=7)
    fig.suptitle(f"Ring allreduce at 100 Mbit/s, every collective of {len(RUNS)} runs (values above 1.07 clipped)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if PLOT_PATH:
    plot(PLOT_PATH)
