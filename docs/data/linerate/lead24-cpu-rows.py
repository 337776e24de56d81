"""CPU per GB of the issue's 100 Mbit/s rows: the twenty-second session's runs (torch reduces every slice)
against the twenty-fourth's (numpy). Different sessions, so different machine weather: per row, the
median of geryon's `cpu_s_per_gb` and gloo's over the runs, and geryon's over gloo's in the same run.

    python docs/data/linerate/lead24-cpu-rows.py
"""
import json
import pathlib
import statistics

HERE = pathlib.Path(__file__).parent
SESSIONS = {"twenty-second (torch)": [f"lead22-allreduce-100mbit-{r}" for r in "abcdefgh"],
            "twenty-fourth (numpy)": [f"lead24-allreduce-100mbit-{r}" for r in "abcde"]}

records_of = {session: [json.loads(line) for run in runs for line in (HERE / f"{run}.jsonl").read_text().splitlines()]
              for session, runs in SESSIONS.items()}
print("row          session                 runs  geryon s/GB  gloo s/GB  geryon / gloo (median, min-max)")
for workers, size in [(4, 10**7), (4, 10**8), (8, 10**7), (8, 10**8)]:
    for session, session_records in records_of.items():
        records = [r for r in session_records if r["workers"] == workers and r["size_bytes"] == size]
        ours = [r["cpu_s_per_gb"] for r in records]
        gloo = [r["gloo_cpu_s_per_gb"] for r in records]
        over = sorted(a / b for a, b in zip(ours, gloo))
        print(f"{workers} x {size / 1e6:>3.0f} MB   {session:<22}  {len(records):>4}  {statistics.median(ours):>11.2f}"
              f"  {statistics.median(gloo):>9.2f}  {statistics.median(over):.2f} ({over[0]:.2f}-{over[-1]:.2f})")
