"""One process of a transport job, runnable anywhere: `python -m geryon.bench.transport_roles ROLE ...`.

Used by the benchmarks (inside emulated hosts) and by the failure tests. Each role prints one JSON
object per line on stdout ({"event": "ready"} first, then results); errors go to stderr and exit 1.

    allreduce  --rank R --peers H:P,H:P,...   ring allreduce of --sizes (bytes), --iters times each
    gloo       --rank R --world N --master H:P torch.distributed gloo allreduce, same sizes
    wire-ring  --rank R --world N --master H:P --peers H:P,...
                                               the wire's ceiling for a ring: plain TCP streams of the
                                               bytes a ring link carries, no reduction (run_wire_ring)
    ps-server  --index S --servers M --workers W --listen H:P --sizes ...
    ps-worker  --rank W --workers W --servers H:P,... --sizes ... --iters K
    prio-server / prio-worker                  the priority benchmark (see geryon.bench.priority)

`--trace FILE` appends every TransferEvent (geryon.transport.trace) to FILE as JSON lines.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import resource
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from geryon import envvars
from geryon.bench.paper_math import read_proc_stat
from geryon.errors import GeryonError, TransportError
from geryon.quickexit import exit_without_collecting
from geryon.transport.config import TransportConfig
from geryon.transport.tls import load_credentials


def _emit(**record) -> None:
    print(json.dumps(record), flush=True)


def parse_addresses(text: str) -> list[tuple[str, int]]:
    """`HOST:PORT,HOST:PORT,...` (a role's --peers or --servers) as (host, port) pairs."""
    out = []
    for item in text.split(","):
        host, port = item.rsplit(":", 1)
        out.append((host, int(port)))
    return out


def _tracer(path: str | None):
    """A tracer appending each TransferEvent as a JSON line to `path` (None: no tracing)."""
    if not path:
        return None
    import dataclasses
    import threading
    out, lock = open(path, "a", buffering=1 << 20), threading.Lock()

    def write(event) -> None:
        line = json.dumps(dataclasses.asdict(event)) + "\n"
        with lock:
            out.write(line)

    atexit.register(out.close)
    return write


def transport_config(args) -> TransportConfig:
    """The TransportConfig a role process's flags describe."""
    return TransportConfig(tracer=_tracer(args.trace), secret=args.secret, job_id=args.job,
                           policy=args.policy,
                           class_dscp=tuple(int(d) for d in args.dscp.split(",")),
                           slice_bytes=args.slice_bytes, timeout=args.timeout,
                           connect_timeout=args.connect_timeout,
                           max_slice_bytes=max(args.max_slice_bytes, args.slice_bytes),
                           tcp_congestion=args.congestion,
                           notsent_lowat=args.notsent_lowat or None, rto_min_us=args.rto_min_us or None,
                           thread_rt_priority=args.thread_rt_priority,
                           compact_headers=not args.full_headers,
                           tls=load_credentials(args.tls_file) if args.tls_file else None)


def _tensors(size_bytes: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(max(1, size_bytes // 4), generator=generator)


START_LEAD_S = 0.1   # how far ahead of the last rank's arrival the common start of a timed collective is set


def start_together(rank: int, world: int, allreduce) -> float:
    """Agree on a wall-clock instant with one allreduce, sleep until it and return it: every rank of a
    timed collective starts at the same instant and is timed from it, so each rank's time ends where
    its collective does. The instant is START_LEAD_S after the latest rank's arrival here (each rank
    puts its clock + START_LEAD_S in its own slot of a sum with zeros: exact, the same on every rank),
    so a rank that arrives late never finds the instant already passed.

    The emulated hosts share one kernel clock. A barrier alone leaves the ranks' starts spread by how
    it releases them (a ring barrier: N-1 hops, the first rank out charged all of it; gloo's barrier:
    all-to-all, one hop), which would measure the barrier, not the collective (docs/transport.md).
    """
    arrivals = torch.zeros(world, dtype=torch.float64)
    arrivals[rank] = time.time() + START_LEAD_S
    allreduce(arrivals)
    start = arrivals.max().item()
    time.sleep(max(0.0, start - time.time()))
    return start


def refill_between(barrier, work: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
    """Copy `tensors` into the reused `work` buffers once every rank has finished the last collective
    (`barrier` returns only then).

    Copied as soon as a rank's own collective ended instead, a rank that finished first would copy
    (a memcpy of the whole size) while the others still finish, taking a shared core
    from them: the traced 8 x 10 MB ring lost up to 22 ms between a rank's last piece and the end
    of its collective that way (docs/transport.md). Both systems alike.
    """
    barrier()
    for target, source in zip(work, tensors):
        target.copy_(source)


class MachineSeconds(NamedTuple):
    """CPU seconds of every CPU since boot (/proc/stat, which is not per network namespace)."""
    busy: float    # all but idle, iowait and steal: the ranks, the kernel's softirq work charged to no
                   # process (on the emulated cluster that includes the switch), and any other load
    steal: float   # the vCPUs ready to run while the hypervisor ran another guest: nobody's work here,
                   # but every process of the emulated cluster, its switch included, stood still


def machine_seconds() -> MachineSeconds:
    stat = read_proc_stat()
    tick = os.sysconf("SC_CLK_TCK")
    return MachineSeconds(stat.busy / tick, stat.steal / tick)


class ProcessUsage(NamedTuple):
    """This process's user CPU seconds, context switches and minor page faults so far, all threads
    (getrusage; the kernel splits its exact CPU time into user and system by where its clock ticks fell)."""
    user: float        # the interpreter, numpy and torch: what a transport's own code costs
    switches: int      # voluntary and involuntary: each is a thread that slept or was preempted
    minor_faults: int  # first touches of fresh pages


def process_usage() -> ProcessUsage:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return ProcessUsage(usage.ru_utime, usage.ru_nvcsw + usage.ru_nivcsw, usage.ru_minflt)


@dataclass
class Timed:
    """What `time_collectives` measured. `machine_cpu` and `steal` are rank 0's only (None elsewhere)."""
    times: list[float]                 # each collective's seconds from the common start
    starts: list[float]                # the common starts (time.time())
    cpu: float                         # this process's CPU seconds over its timed parts
    machine_cpu: float | None          # the machine's busy CPU seconds (`machine_seconds`) over them
    steal: list[float] | None          # per collective: CPU seconds the hypervisor gave other guests
    user_cpu: float                    # the user-space part of `cpu` (the rest is the kernel's)
    switches: int                      # this process's context switches over its timed parts

    def record(self) -> dict:
        """The result record's fields; `seconds` is the median (the upper one of an even count)."""
        fields = {"seconds": statistics.median_high(self.times), "all_seconds": self.times,
                  "all_starts": self.starts, "cpu_seconds": self.cpu, "user_cpu_seconds": self.user_cpu,
                  "context_switches": self.switches}
        if self.machine_cpu is not None:
            fields.update(machine_cpu_seconds=self.machine_cpu, all_steal_seconds=self.steal)
        return fields


def time_collectives(rank: int, world: int, iters: int, small_allreduce, collective, work, tensors,
                     after_each=None) -> Timed:
    """`iters` timed runs of `collective()` (which reduces `work` in place): before each, `work` is refilled
    from `tensors` after a barrier and every rank starts together. `small_allreduce(t)` sums a small
    float64 tensor across the ranks (the barrier and the start). Rank 0 also reads the machine's busy
    and stolen CPU (`machine_seconds`, ~20 us) around each run; `after_each(i)` runs after run i.

    After each run, every rank waits at a barrier for every other rank's end before it goes on (to
    `after_each`, to the next refill, or, after the last run, to its results and teardown). A rank
    that went on at once would run that work on the shared cores while its peers still receive their
    last pieces: without this barrier, geryon's ranks that finished the last timed collective first
    started tearing down, and the ranks still receiving took 1.8 ms longer in the median, up to 17 ms
    (docs/transport.md). Every system alike.
    """
    flag = torch.zeros(1, dtype=torch.float64)   # the barrier's tensor, kept: a sum of zeros stays zero
    machine_clock = machine_seconds if rank == 0 else (lambda: MachineSeconds(0.0, 0.0))
    times, starts, cpu, machine, steal, user, switches = [], [], 0.0, 0.0, [], 0.0, 0

    def barrier():
        small_allreduce(flag)

    for i in range(iters):
        refill_between(barrier, work, tensors)
        started = start_together(rank, world, small_allreduce)
        cpu_started, machine_started, usage_started = time.process_time(), machine_clock(), process_usage()
        collective()
        times.append(time.time() - started)
        machine_ended, usage_ended = machine_clock(), process_usage()
        starts.append(started)
        cpu += time.process_time() - cpu_started
        user += usage_ended.user - usage_started.user
        switches += usage_ended.switches - usage_started.switches
        machine += machine_ended.busy - machine_started.busy
        steal.append(machine_ended.steal - machine_started.steal)
        barrier()                                 # every rank has ended run i
        if after_each is not None:
            after_each(i)
    if rank != 0:
        return Timed(times, starts, cpu, None, None, user, switches)
    return Timed(times, starts, cpu, machine, steal, user, switches)


def allreduce_inputs(size: int, rank: int, two_classes: bool) -> tuple[list[torch.Tensor], list[int]]:
    """The tensors a benchmark rank reduces: one of `size` bytes, or a high- and a low-class pair."""
    if not two_classes:
        return [_tensors(size, rank)], [0]
    return [_tensors(max(4, size // 8), 1000 + rank), _tensors(size, rank)], [0, 1]


def run_allreduce(args) -> None:
    from geryon.transport.allreduce import AllreduceGroup
    peers = parse_addresses(args.peers)
    config = transport_config(args)
    with AllreduceGroup(args.rank, len(peers), peers, config, listen=("0.0.0.0", peers[args.rank][1])) as group:
        _emit(event="ready", rank=args.rank)
        for size in args.sizes:
            tensors, priorities = allreduce_inputs(size, args.rank, args.two_classes)
            work = [t.clone() for t in tensors]
            # warm-up and plan agreement, on the buffers the timed collectives reduce (refilled before
            # each), as a training loop reduces the same gradient buffers every iteration: the first
            # timed collective then finds its plan and views prepared like the others
            group.allreduce(work, priorities)

            def checksum(i: int) -> None:
                digest = hashlib.sha256(b"".join(w.numpy().tobytes() for w in work)).hexdigest()
                _emit(event="iteration", size_bytes=size, iteration=i, sha256=digest)

            timed = time_collectives(
                args.rank, len(peers), args.iters, lambda t: group.allreduce([t]),
                lambda: group.allreduce(work, priorities), work, tensors,
                after_each=checksum if args.checksum else None)
            _emit(event="result", system="geryon", size_bytes=size, **timed.record())


def run_gloo(args) -> None:
    import torch.distributed as dist
    host, port = args.master.rsplit(":", 1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=args.rank,
                            world_size=args.world)
    _emit(event="ready", rank=args.rank)
    try:
        for size in args.sizes:
            tensor = _tensors(size, args.rank)
            work = tensor.clone()
            dist.all_reduce(work)              # warm-up, on the timed collectives' buffer as geryon's
            timed = time_collectives(args.rank, args.world, args.iters, dist.all_reduce,
                                     lambda: dist.all_reduce(work), [work], [tensor])
            _emit(event="result", system="gloo", size_bytes=size, **timed.record())
    finally:
        dist.destroy_process_group()


WIRE_BUFFER_BYTES = 4 << 20   # what a wire-ring rank sends from and reads into, reused


def ring_link_bytes(size: int, world: int) -> int:
    """Bytes one rank's port carries in a ring allreduce of `size` bytes: 2(N-1)/N of the data."""
    return 2 * (world - 1) * size // world


def _wire_ring_sockets(args):
    """This rank's plain TCP sockets to its right and from its left neighbour (gloo's rendezvous, done
    after this rank listens, is the barrier that makes every listener exist before anyone dials)."""
    import torch.distributed as dist
    peers = parse_addresses(args.peers)
    listener = socket.create_server(("0.0.0.0", peers[args.rank][1]))
    listener.settimeout(args.timeout)
    host, port = args.master.rsplit(":", 1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=args.rank, world_size=args.world)
    right = socket.create_connection(peers[(args.rank + 1) % args.world], timeout=args.timeout)
    left, _ = listener.accept()
    listener.close()
    for sock in (right, left):
        sock.settimeout(args.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return right, left


def send_right_receive_left(right, left, nbytes: int, out: memoryview, inbox: memoryview, pool) -> None:
    """Send `nbytes` to the right (a thread) while reading as many from the left."""

    def send() -> None:
        left_to_send = nbytes
        while left_to_send:
            chunk = min(left_to_send, len(out))
            right.sendall(out[:chunk])
            left_to_send -= chunk

    sending = pool.submit(send)
    got = 0
    try:
        while got < nbytes:
            n = left.recv_into(inbox, min(len(inbox), nbytes - got), socket.MSG_WAITALL)
            if n == 0:
                raise TransportError(f"the left neighbour closed its stream after {got} of {nbytes} bytes")
            got += n
        sending.result()
    except OSError as exc:    # socket.timeout included: a neighbour died or stalled
        raise TransportError(f"wire ring stream failed after {got} of {nbytes} bytes read: {exc!r}") from None


def run_wire_ring(args) -> None:
    """The wire's own ceiling for a ring allreduce, timed exactly like the collectives.

    Each rank streams the bytes its port carries in a ring allreduce of each size
    (`ring_link_bytes`) to its right neighbour over one plain TCP socket while reading as many from
    its left: every port busy one way with data and the other with ACKs, as in the ring, but no
    reduction and no piece waiting for another (a link that falls behind holds up no other). Sockets
    as gloo's (TCP_NODELAY, the host's congestion control, DSCP 0). gloo serves only as the barrier
    and the common start (`time_collectives`). This is what TCP with gloo's socket settings gets from
    the emulated ports; a collective can come in a little under it only through other socket
    settings (geryon's flows: their class's DSCP, the 10 ms RTO floor, TCP_NOTSENT_LOWAT) or the
    run-to-run spread (docs/transport.md).
    """
    from concurrent.futures import ThreadPoolExecutor

    import torch.distributed as dist
    right, left = _wire_ring_sockets(args)
    out = memoryview(bytearray(WIRE_BUFFER_BYTES))
    inbox = memoryview(bytearray(WIRE_BUFFER_BYTES))
    _emit(event="ready", rank=args.rank)
    try:
        with ThreadPoolExecutor(1) as pool:
            for size in args.sizes:
                nbytes = ring_link_bytes(size, args.world)
                send_right_receive_left(right, left, nbytes, out, inbox, pool)    # warm-up, as the collectives have
                timed = time_collectives(
                    args.rank, args.world, args.iters, dist.all_reduce,
                    lambda: send_right_receive_left(right, left, nbytes, out, inbox, pool), [], [])
                _emit(event="result", system="wire-ring", size_bytes=size, **timed.record())
    finally:
        right.close()
        left.close()
        dist.destroy_process_group()


def ps_params(sizes: list[int]) -> list[torch.Tensor]:
    """The PS bench's parameter tensors, `sizes` bytes each, the same on every role (seeded)."""
    return [_tensors(size, 100 + i) for i, size in enumerate(sizes)]


def run_ps_server(args) -> None:
    from geryon.transport.ps_server import ParameterServer
    host, port = args.listen.rsplit(":", 1)
    torch.set_num_threads(1)          # as geryon.runtime.server does
    params = ps_params(args.sizes)
    with ParameterServer(args.index, args.servers, args.workers, params, transport_config(args),
                         (host, int(port)), lr=0.01) as server:
        _emit(event="ready", index=args.index, port=server.port)
        cpu_started, usage_started = time.process_time(), process_usage()
        server.serve_job()
        _emit(event="result", system="geryon-ps-server", cpu_seconds=time.process_time() - cpu_started,
              minor_faults=process_usage().minor_faults - usage_started.minor_faults)


def run_ps_worker(args) -> None:
    from geryon.transport.ps_worker import PSWorker
    params = ps_params(args.sizes)
    total = sum(p.numel() * 4 for p in params)
    with PSWorker(args.rank, args.workers, parse_addresses(args.servers), params, transport_config(args)) as worker:
        _emit(event="ready", rank=args.rank)
        grads = [torch.ones_like(p) for p in params]
        for _ in range(args.warmup):          # untimed: the roles' start-up skew, first-touch faults
            worker.step(grads)
            worker.wait_all()
        times, ends, cpu_started = [], [time.time()], time.process_time()
        for i in range(args.iters):
            started = time.perf_counter()
            worker.step(grads)
            worker.wait_all()
            times.append(time.perf_counter() - started)
            ends.append(time.time())
            if args.checksum:
                _emit(event="iteration", iteration=i)
        median = sorted(times)[len(times) // 2]
        cpu = time.process_time() - cpu_started
        digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
        _emit(event="result", system="geryon-ps", bytes_each_way=total, seconds=median,
              all_seconds=times, all_ends=ends[1:], started=ends[0], sha256=digest, cpu_seconds=cpu)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m geryon.bench.transport_roles")
    parser.add_argument("role", choices=["allreduce", "gloo", "wire-ring", "ps-server", "ps-worker",
                                         "prio-server", "prio-worker"])
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--servers", default="1")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--peers", default="")
    parser.add_argument("--master", default="")
    parser.add_argument("--listen", default="0.0.0.0:0")
    parser.add_argument("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")], default=[1 << 20])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=0, help="ps-worker: untimed iterations first")
    parser.add_argument("--checksum", action="store_true", help="print sha256 of every result")
    parser.add_argument("--two-classes", action="store_true", help="reduce a high and a low tensor")
    parser.add_argument("--policy", default="geryon")
    parser.add_argument("--dscp", default="46,0")
    parser.add_argument("--slice-bytes", type=int, default=TransportConfig.slice_bytes)
    parser.add_argument("--max-slice-bytes", type=int, default=TransportConfig.max_slice_bytes)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--connect-timeout", type=float, default=None,
                        help="seconds to wait for peers at the start (default: --timeout)")
    parser.add_argument("--congestion", default=None)
    parser.add_argument("--notsent-lowat", type=int, default=TransportConfig.notsent_lowat,
                        help="TCP_NOTSENT_LOWAT in bytes; 0 leaves the kernel default")
    parser.add_argument("--rto-min-us", type=int, default=TransportConfig.rto_min_us,
                        help="TCP_RTO_MIN_US in microseconds; 0 leaves the kernel's 200 ms")
    parser.add_argument("--thread-rt-priority", type=int, default=0,
                        help="SCHED_RR priority of the flows' threads (TransportConfig.thread_rt_priority; 0: off)")
    parser.add_argument("--full-headers", action="store_true",
                        help="every frame with the 44-byte header (TransportConfig.compact_headers off)")
    parser.add_argument("--tls-file", default=None, help="TLS on every flow with these credentials (PEM)")
    parser.add_argument("--trace", default=None, help="append TransferEvents as JSON lines here")
    parser.add_argument("--secret", default=os.environ.get(envvars.JOB_SECRET, "geryon-bench"))
    parser.add_argument("--job", type=int, default=1)
    parser.add_argument("--burst-bytes", type=int, default=1 << 20)
    parser.add_argument("--bulk", action="store_true")
    parser.add_argument("--backlog-bytes", type=int, default=8 << 20)
    parser.add_argument("--repeat", type=int, default=3)
    return parser


def main(argv=None) -> int:
    exit_without_collecting()   # a role imports torch: its exit need not collect torch's objects
    args = build_parser().parse_args(argv)
    if args.role in ("ps-server", "prio-server"):
        args.servers = int(args.servers)
    runners = {"allreduce": run_allreduce, "gloo": run_gloo, "wire-ring": run_wire_ring, "ps-server": run_ps_server,
               "ps-worker": run_ps_worker}
    if args.role.startswith("prio-"):
        from geryon.bench import priority
        runners.update({"prio-server": priority.run_server, "prio-worker": priority.run_worker})
    try:
        runners[args.role](args)
    except GeryonError as exc:
        print(f"geryon {args.role}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
