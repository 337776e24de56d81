"""Each job's iteration split into compute, time blocked on the network and CPU wait, per policy.

    sudo .venv/bin/python probe_blocked.py resnet50:allreduce bg|nobg

One repetition of `geryon bench tenants` for the given jobs (2 workers each, 200 Mbit/s, size scale
0.01, 2 warm-up and 10 measured iterations, every policy), keeping the workers' per-step records the
bench summarises: per job, one JSON line with the bench's row plus the mean time a step was blocked
in its pull (PS) or allreduce (ring) hooks and the median over iterations of the slowest worker's.
"""
import json
import statistics
import sys

import geryon.bench.tenants as tenants
from tenants_steps import segments


def main() -> None:
    models, background = tuple(sys.argv[1].split(",")), sys.argv[2] == "bg"
    settings = tenants.TenantSettings(models=models, workers=2, iterations=10, warmup=2, repetitions=1,
                                      background=background)
    loads: dict = {}
    for policy, row, job_steps in segments(settings, loads):
        for job, steps in zip(row["jobs"], job_steps):
            job["blocked_mean_s"] = statistics.mean(s["blocked_s"] for worker in steps for s in worker)
            job["slowest_blocked_s"] = statistics.median(max(worker[i]["blocked_s"] for worker in steps)
                                                         for i in range(settings.iterations))
            job.pop("classes")
        print(json.dumps({"policy": policy, "background_share": row["background_share"], "jobs": row["jobs"]}),
              flush=True)
    print(json.dumps({"load_average": loads}))


if __name__ == "__main__":
    main()
