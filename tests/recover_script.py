"""A tiny PS training run for the recovery tests (tests/test_launch_recover.py).

Step i trains on the global batch made from seed 1000 + i, so a run resumed at step S (ctx.resumed_step)
sees the same data as one that never stopped. `--kill worker|server --kill-at N`: in the first start only
(ctx.restart_count 0), after step N, worker 1 SIGKILLs itself, or worker 0 SIGKILLs the job's server 0.
Worker 0 saves the final state_dict to --out.
"""

import argparse
import os
import signal
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import geryon

GLOBAL_BATCH = 16


def server_pid(job_id: str) -> int:
    """The process id of this job's server 0 (same user): the process with its variables (a rank
    started with --start exec), or named server0 beside this worker under the same template (fork)."""
    wanted = {f"GERYON_JOB_ID={job_id}".encode(), b"GERYON_ROLE=server", b"GERYON_SERVER_RANK=0"}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                variables = set(handle.read().split(b"\0"))
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/comm") as handle:
                name = handle.read().strip()
        except OSError:
            continue
        if wanted <= variables or (name == "server0" and parent == os.getppid()):
            return int(entry)
    raise SystemExit(f"no server 0 of job {job_id} found")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--kill", choices=("none", "worker", "server"), default="none")
    parser.add_argument("--kill-at", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    ctx = geryon.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = geryon.distribute(model, optimizer)
    print(f"start {ctx.restart_count} resumes at step {ctx.resumed_step}", flush=True)
    for step in range(ctx.resumed_step, args.iterations):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 1, generator=g)
        xs, ys = x.chunk(ctx.world_size)[ctx.rank], y.chunk(ctx.world_size)[ctx.rank]
        optimizer.zero_grad()
        F.mse_loss(model(xs), ys).backward()
        optimizer.step()
        if ctx.restart_count == 0 and step + 1 == args.kill_at:
            if args.kill == "worker" and ctx.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if args.kill == "server" and ctx.rank == 0:
                os.kill(server_pid(ctx.job_id), signal.SIGKILL)
                time.sleep(60)   # the launcher sees the server die and stops this start
    if ctx.rank == 0:
        module = model.module if hasattr(model, "module") else model
        torch.save(module.state_dict(), args.out)


if __name__ == "__main__":
    main()
