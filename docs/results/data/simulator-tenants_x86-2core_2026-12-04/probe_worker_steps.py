"""Every worker's step and blocked time per measured iteration of `geryon bench tenants`, per policy.

    sudo .venv/bin/python probe_worker_steps.py [POLICY,...]

One repetition of the bench's default mix (a VGG-19 PS job and a ResNet-50 ring job, 2 workers each,
200 Mbit/s, size scale 0.01, 2 warm-up and 10 measured iterations, background on); per job, the
bench's iteration (the median of the slowest worker's per iteration), the mean step, and each
worker's steps and blocked times in milliseconds.
"""
import statistics
import sys

import geryon.bench.tenants as tenants
from tenants_steps import segments


def main() -> None:
    policies = tuple(sys.argv[1].split(",")) if len(sys.argv) > 1 else tenants.POLICIES
    settings = tenants.TenantSettings(repetitions=1, policies=policies)
    loads: dict = {}
    for policy, row, job_steps in segments(settings, loads):
        for job, steps in zip(row["jobs"], job_steps):
            seconds = [[round(step["seconds"] * 1e3) for step in worker] for worker in steps]
            blocked = [[round(step["blocked_s"] * 1e3) for step in worker] for worker in steps]
            print(f"{policy} {job['job']}: iteration {job['median_iteration_s'] * 1e3:.0f} ms, mean step "
                  f"{statistics.mean(x for worker in seconds for x in worker):.0f} ms", flush=True)
            for index, (mine, waits) in enumerate(zip(seconds, blocked)):
                print(f"   worker {index} steps {mine} blocked {waits}", flush=True)
    print(f"load average before {loads['before']:.2f}, after {loads['after']:.2f}")


if __name__ == "__main__":
    main()
