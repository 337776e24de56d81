"""The probes' shared part: run `geryon bench tenants` segments keeping the workers' per-step records
that the bench summarises (its `_run_all`, wrapped), and the load average around them."""
import geryon.bench.tenants as tenants

_run_all = tenants._run_all
_captured: list = []


def _capturing(jobs, iterations):
    steps = _run_all(jobs, iterations)
    _captured.append(steps)
    return steps


def segments(settings, loads: dict):
    """Yield (policy, the bench's row, each job's workers' steps) for each of `settings.policies`;
    `loads` gets the load average before and after."""
    tenants._run_all = _capturing
    bench = tenants.TenantsBench(settings)
    loads["before"] = tenants.load_average()
    bench.start()
    try:
        for policy in settings.policies:
            row = bench.segment(policy)
            yield policy, row, _captured[-1]
    finally:
        bench.stop()
        loads["after"] = tenants.load_average()
