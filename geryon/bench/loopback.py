"""Allreduce with CUDA or CPU tensors between local processes over loopback (no emulated cluster).

    geryon bench allreduce --device cuda [--workers 4] [--sizes 1e8] [--repeat 3]
    geryon bench transport --device cuda [--size-mb 25]       (the 2-rank ring)
    geryon bench allreduce --loopback --device cpu            (the same rows with CPU tensors only)

A machine with GPUs but no network-namespace tools (no pyroute2, no root) still measures what the
staging costs: every system runs its ranks as local processes joined by loopback TCP, one after the
other, on the same link, so the rows compare like with like. With `--device cuda` each size gives:

  geryon_cuda_seconds    geryon's ring with CUDA tensors (slices staged through pinned host slots,
                         summed on the GPU: geryon.transport.staging)
  geryon_cpu_seconds     geryon's ring with the same data as CPU tensors (the ring's own bound here)
  gloo_cuda_seconds      torch.distributed gloo's all_reduce of the same CUDA tensors
  *_gbps                 the collective's size over its median time (GB/s of data reduced)
  *_cpu_s_per_gb         CPU seconds (user + system, every rank's process) per GB its ring links
                         carried (2 (N-1)/N of the data per rank)
  copy_seconds           what one rank's copies take alone: the bytes it stages out and in (2 (N-1)/N
                         of the data each way) at the device-to-pinned and pinned-to-device rates
                         measured on this GPU
  hidden_share           1 - (geryon_cuda_seconds - geryon_cpu_seconds) / copy_seconds, within [0, 1]:
                         the part of the copy time the wire hid
  ratio_cuda_vs_cpu, ratio_cuda_vs_gloo_cuda

Several ranks share the GPUs (rank r takes GPU r mod count). Times are medians of --repeat timed
collectives after one untimed one; every rank starts each timed collective after a barrier.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time

import torch
import torch.multiprocessing as mp

from geryon.errors import ConfigError

BENCH_SECRET = "geryon-loopback-bench"


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago (all bound at once, then released)."""
    holders = [socket.socket() for _ in range(count)]
    for s in holders:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in holders]
    for s in holders:
        s.close()
    return ports


def _device_of(device: str, rank: int) -> torch.device:
    if device == "cuda":
        device_ = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device_)
        return device_
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rank(rank: int, world: int, system: str, device: str, numel: int, repeat: int, ports: list[int],
          slice_bytes: int, results) -> None:
    """One rank of one system: `repeat` timed allreduces after an untimed one; puts (rank, times, cpu_s)."""
    torch.set_num_threads(1)
    where = _device_of(device, rank)
    data = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).to(where)
    if system == "geryon":
        from geryon.transport import AllreduceGroup
        from geryon.transport.config import TransportConfig

        config = TransportConfig(secret=BENCH_SECRET, job_id=7, slice_bytes=slice_bytes, timeout=120)
        peers = [("127.0.0.1", port) for port in ports]
        group = AllreduceGroup(rank, world, peers, config, listen=peers[rank])
        token = torch.zeros(1)

        def barrier():
            group.allreduce([token])

        def collective():
            group.allreduce([data])
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank, world_size=world)
        group = None

        def barrier():
            dist.barrier()

        def collective():
            dist.all_reduce(data)
    try:
        collective()
        _sync(where)
        times, cpu = [], 0.0
        for _ in range(repeat):
            barrier()
            started, cpu_started = time.perf_counter(), time.process_time()
            collective()
            _sync(where)
            times.append(time.perf_counter() - started)
            cpu += time.process_time() - cpu_started
        barrier()
        results.put((rank, times, cpu))
    finally:
        if group is not None:
            group.close()
        else:
            import torch.distributed as dist

            dist.destroy_process_group()


def run_system(system: str, device: str, world: int, numel: int, repeat: int,
               slice_bytes: int = 256 * 1024) -> tuple[float, float]:
    """(median seconds of rank 0's timed collectives, CPU seconds of every rank) of one system."""
    context = mp.get_context("spawn")
    results = context.Queue()
    ports = free_ports(world)
    procs = [context.Process(target=_rank, args=(r, world, system, device, numel, repeat, ports, slice_bytes,
                                                 results), daemon=True) for r in range(world)]
    for proc in procs:
        proc.start()
    got = {}
    try:
        while len(got) < world:
            rank, times, cpu = results.get(timeout=600)
            got[rank] = (times, cpu)
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed:
        raise RuntimeError(f"{system} ranks exited with {failed}")
    return statistics.median(got[0][0]), sum(cpu for _, cpu in got.values()) / repeat


def copy_rates(numel: int) -> tuple[float, float]:
    """Bytes/s of a device-to-pinned and a pinned-to-device copy of `numel` float32 on this GPU."""
    device = torch.device("cuda", 0)
    source = torch.randn(numel, device=device)
    pinned = torch.empty(numel).pin_memory()
    nbytes = numel * 4
    rates = []
    for copy in (lambda: pinned.copy_(source, non_blocking=True), lambda: source.copy_(pinned, non_blocking=True)):
        copy()
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(5):
            copy()
        torch.cuda.synchronize(device)
        rates.append(5 * nbytes / (time.perf_counter() - started))
    return rates[0], rates[1]


def allreduce_rows(device: str, workers: list[int], sizes: list[int], repeat: int,
                   slice_bytes: int = 256 * 1024):
    """One row (a dict) per (workers, size in bytes of float32 data)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this process sees no CUDA GPU; run the bench on a machine with one "
                          "(or --device cpu)")
    for world in workers:
        for size in sizes:
            numel = max(world, size // 4)
            nbytes = numel * 4
            link_gb = world * 2 * (world - 1) / world * nbytes / 1e9
            row = {"bench": "allreduce-loopback", "device": device, "workers": world, "size_bytes": nbytes,
                   "repeat": repeat, "link": "loopback", "torch": torch.__version__}
            systems = [("geryon_cpu", "geryon", "cpu"), ("gloo_cpu", "gloo", "cpu")]
            if device == "cuda":
                systems = [("geryon_cuda", "geryon", "cuda"), *systems[:1], ("gloo_cuda", "gloo", "cuda")]
            for name, system, where in systems:
                seconds, cpu = run_system(system, where, world, numel, repeat, slice_bytes)
                row[f"{name}_seconds"] = round(seconds, 6)
                row[f"{name}_gbps"] = round(nbytes / seconds / 1e9, 4)
                row[f"{name}_cpu_s_per_gb"] = round(cpu / link_gb, 4)
            if device == "cuda":
                out_rate, in_rate = copy_rates(numel)
                staged = 2 * (world - 1) / world * nbytes
                copy_seconds = staged / out_rate + staged / in_rate
                extra = row["geryon_cuda_seconds"] - row["geryon_cpu_seconds"]
                row.update(d2h_gbps=round(out_rate / 1e9, 2), h2d_gbps=round(in_rate / 1e9, 2),
                           copy_seconds=round(copy_seconds, 6),
                           hidden_share=round(min(1.0, max(0.0, 1 - extra / copy_seconds)), 3),
                           ratio_cuda_vs_cpu=round(row["geryon_cuda_seconds"] / row["geryon_cpu_seconds"], 3),
                           ratio_cuda_vs_gloo_cuda=round(row["geryon_cuda_seconds"] / row["gloo_cuda_seconds"], 3))
            else:
                row["ratio_vs_gloo_cpu"] = round(row["geryon_cpu_seconds"] / row["gloo_cpu_seconds"], 3)
            yield row


def print_rows(rows, as_json: bool) -> None:
    for row in rows:
        if as_json:
            print(json.dumps(row), flush=True)
            continue
        systems = [k[:-len("_seconds")] for k in row if k.endswith("_seconds") and k != "copy_seconds"]
        cells = ", ".join(f"{s} {row[f'{s}_seconds'] * 1e3:.1f} ms ({row[f'{s}_gbps']:.2f} GB/s, "
                          f"{row[f'{s}_cpu_s_per_gb']:.2f} CPU s/GB)" for s in systems)
        hidden = f", copies {row['hidden_share']:.0%} hidden" if "hidden_share" in row else ""
        print(f"{row['workers']} ranks, {row['size_bytes'] / 1e6:g} MB over loopback: {cells}{hidden}", flush=True)


def run(args, *, workers: list[int], sizes: list[int], repeat: int) -> int:
    """The CLI's entry (bench allreduce / bench transport with --device cuda or --loopback)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print_rows(allreduce_rows(args.device, workers, sizes, repeat, args.slice_bytes), args.json)
    return 0
