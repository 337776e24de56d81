"""A synchronous parameter-server job in the fluid network: compute, pushes, updates, pulls.

Each worker runs:
    forward  layer l = 0..L-1 starts when layer l-1 is done and every slice of layer l is pulled;
    backward layers L-1..0 back to back; a layer's slices enter the push queues when its backward
             ends; the pull of the next version is requested when the backward pass ends
             (`pull_ahead`: with the first push, bench paper's --pull ahead).
A server updates a slice when every worker's push of it has arrived (+ `aggregation_s`) and sends
it to a worker once updated and asked for (slices already updated go in plan order, as
ParameterServer.control sends them). A worker on the server's own host (colocated layout) moves
its share through memory, at once.

Two granularities (`exact`):
- aggregate (default): every worker computes alike, so ONE representative worker stands for all,
  and each (server, direction, connection) is one flow group of all remote workers' connections
  (fabric.py) -- state per server, not per pair: cheap at 1024 workers;
- exact: every worker and every (worker, server, direction, connection) is simulated on its own
  -- the reference that measures what the aggregation costs, for small clusters.
A connection sends one frame at a time, the most urgent by the policy's send key; a started frame
runs to its end (it is in the socket). The network moves from event to event (a frame reaches an
idle connection, a frame completes, a compute step ends); rates (fabric.allocate) are recomputed
only when the set of connections with bytes on the wire changed.

Two TCP effects a pure fluid model lacks, both off by default (0):
- `backlog_bytes` (S): the kernel holds up to S bytes of a connection (unsent bytes under
  TCP_NOTSENT_LOWAT plus the congestion window in flight, queued in the bottleneck's FIFO). The
  sender commits its next frame -- chooses it from its priority queue, after which it can no
  longer be overtaken -- as soon as the connection's committed-but-undelivered bytes fall to S,
  not when the previous frame is delivered. An urgent frame arriving at a busy connection therefore
  waits for S more bytes at the connection's rate: the head-of-line blocking end-host ordering
  cannot undo. Under `geryon` the urgent class has its own connection, so its backlog is urgent bytes.
- `queues` (a QueueTable): standing FIFO queues at the host ports (queues.py): a frame reaches
  its receiver the queueing delay of its class's queues later.
- `latency_s` (d): every frame that crosses the network reaches its receiver d after its last byte
  is delivered (the per-message cost of the sending and receiving processes; the no-limit control
  row of `bench paper` measures it, see compare.py).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from geryon.errors import ConfigError
from geryon.sim.fabric import Fabric, GroupSet, allocate
from geryon.sim.queues import PortQueues, QueueTable
from geryon.sim.workload import Workload

PUSH, PULL = 0, 1
EXACT_LIMIT = 64   # workers: beyond this the exact model is too slow to be useful


@dataclass
class JobResult:
    """What one simulated run produced (seconds)."""

    iteration_end: list[float]          # backward end of each iteration (worker 0)
    compute_s: float                    # forward + backward of one iteration
    events: int = 0                     # rate recomputations
    first_layer_wait: list[float] = field(default_factory=list)  # per iteration: stall before layer 0
    wire_bytes: dict = field(default_factory=dict)   # network class -> bytes sent over links

    def iteration_s(self, warmup: int = 1) -> float:
        """Mean period between backward ends after `warmup` iterations."""
        ends = self.iteration_end
        if len(ends) < 2:
            return ends[0] if ends else math.nan
        start = min(warmup, len(ends) - 2)
        return (ends[-1] - ends[start]) / (len(ends) - 1 - start)


class _Worker:
    """One worker's compute state (the representative one in the aggregate model)."""

    def __init__(self, layers: int, counts: np.ndarray):
        self.layer, self.clock, self.iteration = 0, 0.0, 0
        self.counts = counts
        self.pending = np.zeros(layers, dtype=np.int64)
        self.pulled_at = np.zeros(layers)
        self.requested = False
        self.unsent = 0


class PSJob:
    """Simulate `workload` on `fabric` with per-layer compute `forward_s`/`backward_s`."""

    def __init__(self, workload: Workload, fabric: Fabric, forward_s, backward_s,
                 aggregation_s: float = 0.0, exact: bool = False, floor: float = 0.0,
                 backlog_bytes: float = 0.0, latency_s: float = 0.0,
                 queues: QueueTable | None = None, pull_ahead: bool = False):
        self.w, self.fabric = workload, fabric
        self.pull_ahead = bool(pull_ahead)
        self.forward_s = np.asarray(forward_s, dtype=float)
        self.backward_s = np.asarray(backward_s, dtype=float)
        self.aggregation_s = float(aggregation_s)
        self.exact = bool(exact)
        self.floor = float(floor)
        if backlog_bytes < 0 or latency_s < 0:
            raise ConfigError("the socket backlog and the frame latency must be >= 0")
        self.backlog_bytes = float(backlog_bytes)
        self.latency_s = float(latency_s)
        servers = len(fabric.server_host)
        if exact and fabric.workers > EXACT_LIMIT:
            raise ConfigError(f"the exact model is for at most {EXACT_LIMIT} workers; "
                              "use the aggregate model (the default) beyond")
        self.replicas = fabric.workers if exact else 1
        flows = int(workload.flow.max()) + 1 if workload.slices else 1
        count = servers * self.replicas * 2 * flows
        gid = np.arange(count)
        flow_of_group = gid % flows
        direction = (gid // flows) % 2
        replica = (gid // (2 * flows)) % self.replicas
        server = gid // (2 * flows * self.replicas)
        worker_hosts = np.flatnonzero(fabric.is_worker)
        self.groups = GroupSet(fabric, fabric.server_host[server], direction == PULL,
                               flow_of_group if workload.classes > 1 else np.zeros(count, dtype=np.int64),
                               worker_hosts[replica] if exact else None)
        self.flows = flows
        self.ports = PortQueues(self.groups, queues) if queues is not None else None
        layers = len(self.forward_s)
        self.slices_of_layer = [np.flatnonzero(workload.layer == l) for l in range(layers)]
        urgency = (workload.tensor if workload.urgency_order and workload.within_class == "urgency"
                   else np.zeros(workload.slices, dtype=np.int64))
        klass = workload.cls if workload.urgency_order else np.zeros(workload.slices, dtype=np.int64)
        push_klass = klass if workload.push_flow is None or workload.push_flow is workload.flow \
            else np.zeros_like(klass)
        self.key_head = [list(zip(push_klass.tolist(), urgency.tolist())),
                         list(zip(klass.tolist(), urgency.tolist()))]
        self.flow_of = [workload.flow if workload.push_flow is None else workload.push_flow,
                        workload.flow]

    def group(self, slice_: int, direction: int, replica: int) -> int:
        w = self.w
        return int(((w.server[slice_] * self.replicas + replica) * 2 + direction) * self.flows
                   + self.flow_of[direction][slice_])

    def run(self, iterations: int) -> JobResult:
        """Simulate until worker 0 finished `iterations` + 1 iterations (the first is warm-up)."""
        w, layers, replicas = self.w, len(self.forward_s), self.replicas
        groups = len(self.groups)
        members = self.groups.members
        nbytes = w.nbytes.astype(float)
        tol = 1e-9 * max(1.0, float(nbytes.max()) if len(nbytes) else 1.0)
        cap = self.backlog_bytes
        queues: list[list] = [[] for _ in range(groups)]       # frames not yet committed (heaps)
        committed: list[deque] = [deque() for _ in range(groups)]   # in the socket, in order
        queued = np.zeros(groups, dtype=bool)             # queues[g] is not empty
        onwire = np.zeros(groups, dtype=bool)             # committed[g] is not empty
        remaining = np.zeros(groups)                      # bytes until committed[g][0] is delivered
        backlog = np.zeros(groups)                        # committed bytes not yet delivered
        rate = np.zeros(groups)
        seq = itertools.count()
        timers: list = []        # (time, seq, kind, replica, payload)
        counts = np.array([len(s) for s in self.slices_of_layer])
        workers = [_Worker(layers, counts) for _ in range(replicas)]
        arrived = np.zeros(w.slices, dtype=np.int64)      # pushes in for the current version
        waiting = [[] for _ in range(replicas)]            # updated slices not yet asked for
        result = JobResult([], float(self.forward_s.sum() + self.backward_s.sum()))
        wire = np.zeros(max(1, w.classes))
        cls_of_group = self.groups.cls
        state = {"now": 0.0, "dirty": False}

        def enqueue(slice_: int, direction: int, replica: int, t: float) -> None:
            g = self.group(slice_, direction, replica)
            if members[g] == 0:      # nobody remote on this connection: done at once
                finish(slice_, direction, replica, t)
                return
            heapq.heappush(queues[g], (*self.key_head[direction][slice_], next(seq), slice_, direction, replica))
            queued[g] = True
            commit(g)

        def commit(g: int) -> None:
            # the sender hands frames to the kernel while the socket holds at most `cap` bytes
            while queues[g] and backlog[g] <= cap + tol:
                *_, slice_, direction, replica = heapq.heappop(queues[g])
                size = nbytes[slice_]
                committed[g].append((slice_, direction, replica))
                backlog[g] += size
                wire[cls_of_group[g]] += size * members[g]
                if not onwire[g]:
                    onwire[g] = True
                    remaining[g] = size
                    state["dirty"] = True
            queued[g] = bool(queues[g])

        arrival = np.zeros(groups)                        # last frame's arrival per connection
        ports = self.ports

        def delivered(g: int, t: float) -> None:
            delay = self.latency_s + (ports.delay(g, backlog[g]) if ports is not None else 0.0)
            slice_, direction, replica = committed[g].popleft()
            if committed[g]:
                remaining[g] += nbytes[committed[g][0][0]]
            else:
                onwire[g] = False
                remaining[g] = backlog[g] = 0.0
                state["dirty"] = True
            if delay > 0:
                arrival[g] = max(arrival[g], t + delay)      # a connection delivers in order
                heapq.heappush(timers, (arrival[g], next(seq), "arrive", replica, (slice_, direction)))
            else:
                finish(slice_, direction, replica, t)

        def finish(slice_: int, direction: int, replica: int, t: float) -> None:
            if direction == PUSH:
                arrived[slice_] += self.fabric.workers if not self.exact else 1
                if arrived[slice_] >= self.fabric.workers:
                    arrived[slice_] = 0
                    heapq.heappush(timers, (t + self.aggregation_s, next(seq), "updated", -1, slice_))
                return
            worker = workers[replica]
            layer = int(w.layer[slice_])
            worker.pending[layer] -= 1
            worker.pulled_at[layer] = max(worker.pulled_at[layer], t)
            if worker.pending[layer] == 0:
                advance(replica)

        def advance(replica: int) -> None:
            # run the forward pass as far as pulled layers allow, then the whole backward pass
            worker = workers[replica]
            while worker.layer < layers and worker.pending[worker.layer] == 0:
                layer = worker.layer
                if layer == 0 and replica == 0:
                    result.first_layer_wait.append(max(0.0, worker.pulled_at[0] - worker.clock))
                worker.clock = max(worker.clock, worker.pulled_at[layer]) + self.forward_s[layer]
                worker.layer += 1
            if worker.layer < layers:
                return
            clock = worker.clock
            requested = False
            for layer in reversed(range(layers)):
                clock += self.backward_s[layer]
                if len(self.slices_of_layer[layer]):
                    if self.pull_ahead and not requested:   # asked with the first push, ahead of it
                        heapq.heappush(timers, (clock, next(seq), "request", replica, None))
                        requested = True
                    heapq.heappush(timers, (clock, next(seq), "grad", replica, layer))
            if not requested:
                heapq.heappush(timers, (clock, next(seq), "request", replica, None))
            if replica == 0:
                result.iteration_end.append(clock)
            worker.iteration += 1
            worker.layer, worker.clock = 0, clock
            worker.pending[:] = counts
            worker.pulled_at[:] = 0.0

        def send_pull(slice_: int, replica: int, t: float) -> None:
            worker = workers[replica]
            worker.unsent -= 1
            if worker.unsent == 0:      # every slice of this version asked for is on its way
                worker.requested = False
            enqueue(slice_, PULL, replica, t)

        def fire(kind: str, replica: int, payload, t: float) -> None:
            if kind == "arrive":
                finish(payload[0], payload[1], replica, t)
            elif kind == "grad":
                for slice_ in self.slices_of_layer[payload].tolist():
                    enqueue(slice_, PUSH, replica, t)
            elif kind == "request":
                worker = workers[replica]
                worker.requested, worker.unsent = True, w.slices
                ready, waiting[replica] = sorted(waiting[replica]), []   # plan order
                for slice_ in ready:
                    send_pull(slice_, replica, t)
            else:                       # "updated": to every worker, now or when it asks
                for r in range(replicas):
                    if workers[r].requested:
                        send_pull(payload, r, t)
                    else:
                        waiting[r].append(payload)

        for replica in range(replicas):   # iteration 0 starts with every parameter in place
            advance(replica)
        events = 0
        while workers[0].iteration <= iterations:
            busy = np.flatnonzero(onwire)
            now = state["now"]
            if state["dirty"]:
                rate[:] = 0.0
                if len(busy):
                    rate[busy] = allocate(self.groups, busy, self.floor)
                events += 1
                state["dirty"] = False
            t_next = timers[0][0] if timers else math.inf
            if len(busy):
                r = rate[busy]
                with np.errstate(divide="ignore", invalid="ignore"):
                    t_next = min(t_next, now + float((remaining[busy] / r).min()))
                    full = busy[queued[busy] & (backlog[busy] > cap + tol)]
                    if len(full):   # a socket with frames waiting drains to `cap`
                        t_next = min(t_next, now + float(((backlog[full] - cap) / rate[full]).min()))
            if not math.isfinite(t_next):
                raise RuntimeError("simulation stalled: no frame can move and no event is due")
            if len(busy):
                moved = rate[busy] * (t_next - now)
                remaining[busy] -= moved
                backlog[busy] -= moved
            state["now"] = now = t_next
            if len(busy):
                landing = busy[remaining[busy] <= tol]
                if ports is not None and len(landing):
                    ports.update(busy, backlog)      # the queues these frames' last bytes met
                for g in landing.tolist():
                    while committed[g] and remaining[g] <= tol:
                        delivered(g, now)
                for g in busy[queued[busy] & (backlog[busy] <= cap + tol)].tolist():
                    commit(g)
            while timers and timers[0][0] <= now:
                _, _, kind, replica, payload = heapq.heappop(timers)
                fire(kind, replica, payload, now)
        result.events = events
        result.wire_bytes = {c: float(b) for c, b in enumerate(wire)}
        return result
