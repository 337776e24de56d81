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

captured = []
_run_all = tenants._run_all


def run_all(jobs, iterations):
    steps = _run_all(jobs, iterations)
    captured.append(steps)
    return steps


def main() -> None:
    tenants._run_all = run_all
    policies = tuple(sys.argv[1].split(",")) if len(sys.argv) > 1 else tenants.POLICIES
    settings = tenants.TenantSettings(repetitions=1, policies=policies)
    bench = tenants.TenantsBench(settings)
    before = tenants.load_average()
    bench.start()
    try:
        for policy in policies:
            row = bench.segment(policy)
            for job, steps in zip(row["jobs"], captured[-1]):
                seconds = [[round(step["seconds"] * 1e3) for step in worker] for worker in steps]
                blocked = [[round(step["blocked_s"] * 1e3) for step in worker] for worker in steps]
                print(f"{policy} {job['job']}: iteration {job['median_iteration_s'] * 1e3:.0f} ms, mean step "
                      f"{statistics.mean(x for worker in seconds for x in worker):.0f} ms", flush=True)
                for index, (mine, waits) in enumerate(zip(seconds, blocked)):
                    print(f"   worker {index} steps {mine} blocked {waits}", flush=True)
    finally:
        bench.stop()
    print(f"load average before {before:.2f}, after {tenants.load_average():.2f}")


if __name__ == "__main__":
    main()
