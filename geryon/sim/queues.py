"""Standing queues at the host ports: the queueing delay TCP adds on top of the fluid shares.

A fluid model hands a connection that starts a frame its fair share at once. Real TCP keeps bytes
in flight, and in a FIFO port those bytes of every backlogged connection wait in one queue: a
frame's bytes reach the receiver only after the bytes queued ahead of them drained. With strict
priority each class has its own queue, so an urgent frame waits only behind urgent bytes -- the
mechanism by which network priority beats end-host ordering in a colocated PS, where one host's
worker pushes and its server's parameter sends share one NIC, and several servers' sends meet in
the switch port into each worker.

`PortQueues` models it per (link, class): with n connections of the class active through the link,
the standing queue holds Q(n) bytes and drains at the link rate. Q comes from a `QueueTable`: points
(n, bytes on a host's up link, bytes on a switch port's down link), linear in between and flat past
the last point -- measured on the emulated ports by `python -m geryon.sim.queueprobe` (the two
differ: TCP small queues keep a sender's own egress short, while flows from several hosts fill the
switch port), or `QueueTable.per_flow(w, buffer)`: w bytes per connection up to the buffer. A frame
delivered by the fluid model reaches its receiver that queueing delay later, summed over the two
host links it crosses (sender's up link, receiver's down link; leaf uplinks are not queued here).
In the aggregate model a group's members cross several worker links: the fullest one counts (the
slowest member decides in synchronous PS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from geryon.errors import ConfigError
from geryon.sim.fabric import GroupSet


@dataclass(frozen=True)
class QueueTable:
    """Standing queue bytes vs active connections: rows (connections, up-link bytes, down-link bytes)."""

    rows: tuple[tuple[float, float, float], ...]

    def __post_init__(self):
        rows = tuple(tuple(float(v) for v in row) for row in self.rows)
        if not rows or any(len(r) != 3 or min(r) < 0 for r in rows) or \
                any(b[0] <= a[0] for a, b in zip(rows, rows[1:])):
            raise ConfigError("a queue table is rows (connections, up bytes, down bytes), all >= 0, "
                              "connections increasing")
        if rows[0][0] > 0:
            rows = ((0.0, 0.0, 0.0),) + rows
        object.__setattr__(self, "rows", rows)

    @classmethod
    def per_flow(cls, per_flow_bytes: float, buffer_bytes: float = math.inf) -> "QueueTable":
        """`per_flow_bytes` per connection on every link, at most `buffer_bytes`."""
        if per_flow_bytes <= 0 or buffer_bytes <= 0:
            raise ConfigError("the per-connection queue and the port buffer must be > 0 bytes")
        if not math.isfinite(buffer_bytes):
            buffer_bytes = per_flow_bytes * 1e9
        knee = buffer_bytes / per_flow_bytes
        return cls(((knee, buffer_bytes, buffer_bytes),))

    def scaled(self, factor: float) -> "QueueTable":
        """Bytes x factor (emulated bytes -> paper bytes: 1 / size_scale)."""
        return QueueTable(tuple((n, up * factor, down * factor) for n, up, down in self.rows))

    def bytes(self, connections: np.ndarray, down: bool) -> np.ndarray:
        xs = [r[0] for r in self.rows]
        ys = [r[2 if down else 1] for r in self.rows]
        return np.interp(connections, xs, ys)


class PortQueues:
    """Queueing delay per frame from the connections active on each host link, per class."""

    def __init__(self, groups: GroupSet, table: QueueTable):
        self.groups = groups
        self.table = table
        self.classes = int(groups.cls.max()) + 1 if len(groups) else 1
        hosts = groups.fabric.hosts
        self.up = np.zeros((self.classes, hosts))      # queued bytes per class on each host's up link
        self.down = np.zeros((self.classes, hosts))
        self.share_up = np.zeros((self.classes, hosts))    # at most this much per connection
        self.share_down = np.zeros((self.classes, hosts))
        self._worst = {}

    def update(self, active: np.ndarray, backlog: np.ndarray | None = None) -> None:
        """Recount the queues of every link from the groups in `active` (indices).

        With `backlog` (per group: bytes a member connection has committed and not yet delivered)
        a connection holds at most its backlog in a queue: it gets Q(n) / n of it or less -- a
        connection finishing a small frame cannot keep a bulk flow's standing queue.
        """
        g, fabric = self.groups, self.groups.fabric
        hosts = fabric.hosts
        worker = fabric.is_worker.astype(float)
        self.up[:] = 0.0
        self.down[:] = 0.0
        self.share_up[:] = 0.0
        self.share_down[:] = 0.0
        for klass in range(self.classes):
            idx = active[g.cls[active] == klass]
            if not len(idx):
                continue
            host, pull, members, exact = g.host[idx], g.pull[idx], g.members[idx], g.exact[idx]
            wh = np.where(exact, g.worker_host[idx], 0)
            apush, apull = ~pull & ~exact, pull & ~exact
            epush, epull = ~pull & exact, pull & exact
            n_up = (worker * (apush.sum() - np.bincount(host[apush], minlength=hosts))
                    + np.bincount(host[pull], weights=members[pull], minlength=hosts)
                    + np.bincount(wh[epush], minlength=hosts))
            n_down = (worker * (apull.sum() - np.bincount(host[apull], minlength=hosts))
                      + np.bincount(host[~pull], weights=members[~pull], minlength=hosts)
                      + np.bincount(wh[epull], minlength=hosts))
            q_up = self.table.bytes(n_up, down=False)
            q_down = self.table.bytes(n_down, down=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                s_up = np.where(n_up > 0, q_up / n_up, 0.0)
                s_down = np.where(n_down > 0, q_down / n_down, 0.0)
            self.share_up[klass], self.share_down[klass] = s_up, s_down
            if backlog is None:
                self.up[klass], self.down[klass] = q_up, q_down
                continue
            b = np.asarray(backlog, dtype=float)[idx]
            self.up[klass] = (
                worker * (_capped_sum(b[apush], s_up)
                          - np.bincount(host[apush], weights=np.minimum(s_up[host[apush]], b[apush]),
                                        minlength=hosts))
                + np.bincount(host[pull], weights=members[pull] * np.minimum(s_up[host[pull]], b[pull]),
                              minlength=hosts)
                + np.bincount(wh[epush], weights=np.minimum(s_up[wh[epush]], b[epush]), minlength=hosts))
            self.down[klass] = (
                worker * (_capped_sum(b[apull], s_down)
                          - np.bincount(host[apull], weights=np.minimum(s_down[host[apull]], b[apull]),
                                        minlength=hosts))
                + np.bincount(host[~pull], weights=members[~pull] * np.minimum(s_down[host[~pull]], b[~pull]),
                              minlength=hosts)
                + np.bincount(wh[epull], weights=np.minimum(s_down[wh[epull]], b[epull]), minlength=hosts))
        self._worst = {}

    def _worst_worker(self, table: np.ndarray, share: np.ndarray, klass: int, host: int,
                      own: float) -> float:
        """The fullest queue of `klass`, less this connection's own bytes, on a worker link other
        than `host`'s."""
        key = (id(table), klass, own)
        if key not in self._worst:
            values = np.where(self.groups.fabric.is_worker,
                              table[klass] - np.minimum(share[klass], own), -1.0)
            order = np.argsort(values)[::-1][:2]
            self._worst[key] = (order, values[order])
        order, values = self._worst[key]
        if order[0] != host or len(order) < 2:
            return max(0.0, float(values[0]))
        return max(0.0, float(values[1]))

    def delay(self, group: int, backlog: float = math.inf) -> float:
        """Seconds the last byte of a frame of `group` waits behind OTHER connections' queued
        bytes (its own earlier bytes are already in the fluid model's time); `backlog` is what
        its own connection holds (it counts at most that)."""
        g = self.groups
        klass, host = int(g.cls[group]), int(g.host[group])
        exact = bool(g.exact[group])
        wh = int(g.worker_host[group])
        if g.pull[group]:
            sender = self.up[klass, host] - min(self.share_up[klass, host], backlog)
            receiver = (self.down[klass, wh] - min(self.share_down[klass, wh], backlog) if exact
                        else self._worst_worker(self.down, self.share_down, klass, host, backlog))
        else:
            receiver = self.down[klass, host] - min(self.share_down[klass, host], backlog)
            sender = (self.up[klass, wh] - min(self.share_up[klass, wh], backlog) if exact
                      else self._worst_worker(self.up, self.share_up, klass, host, backlog))
        return (max(0.0, sender) + max(0.0, receiver)) * 8.0 / g.fabric.link_bps


def _capped_sum(values: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """For every cap c: sum over values v of min(v, c) (sorted once, one search per cap)."""
    if not len(values):
        return np.zeros(len(caps))
    ordered = np.sort(values)
    below = np.concatenate([[0.0], np.cumsum(ordered)])
    k = np.searchsorted(ordered, caps, side="right")
    return below[k] + caps * (len(ordered) - k)


# Standing queues measured on emulated ports (`geryon emulate` HTB strict priority, GSO on, as in
# `bench paper`), under the CPU lock: `python -m geryon.sim.queueprobe --flows 1,2,4,7,14 --shape
# spread,one --duration 8 --bw 100mbit,400mbit --json` (mean backlog over ~110 samples; docs/simulator.md).
# Rows: (connections, bytes at a host's own egress = up link, bytes at the switch port into a
# host = down link), in emulated bytes; compare.py scales them by 1 / size_scale.
EMULATED_QUEUES: dict[tuple[str, float], QueueTable] = {
    ("bbr", 100e6): QueueTable(((1, 69e3, 1e3), (2, 146e3, 112e3), (4, 158e3, 129e3),
                                (7, 305e3, 217e3), (14, 870e3, 769e3))),
    # the same with --bw 400mbit (40GbE at size scale 0.01), on an otherwise idle machine, 137 s
    ("bbr", 400e6): QueueTable(((1, 141e3, 26e3), (2, 284e3, 339e3), (4, 455e3, 415e3),
                                (7, 464e3, 456e3), (14, 439e3, 459e3))),
    # cubic at 100 Mbit/s, on an otherwise idle machine, 130 s (docs/results/):
    # cubic fills the port into a host (spread) to MBs, 26-42 KB GSO packets in a 1000-packet pfifo
    ("cubic", 100e6): QueueTable(((1, 136e3, 0.0), (2, 212e3, 2913e3), (4, 545e3, 6869e3),
                                  (7, 962e3, 8286e3), (14, 1858e3, 11144e3))),
}


# Bytes one bulk connection keeps in flight (unacked segments x MSS, `ss -tin` in the senders'
# namespaces), sampled by the same probe beside the port backlog, `spread` shape (N flows from
# different hosts into one switch port: the incast into a colocated host's down link), on an
# otherwise idle machine: `python -m geryon.sim.queueprobe --flows 1,2,4,7,14 --shape spread,one
# --duration 5 --bw 100mbit,400mbit --json` (221 s) and the same with `--bw 100mbit --congestion
# cubic` (records in docs/results/). Rows: (connections, bytes per
# connection), emulated bytes. It is the part of a socket's backlog beyond TCP_NOTSENT_LOWAT: an
# urgent frame that a sender commits behind a bulk one on the SAME connection waits for it too.
EMULATED_INFLIGHT: dict[tuple[str, float], tuple[tuple[float, float], ...]] = {
    ("bbr", 100e6): ((1, 93.2e3), (2, 56.8e3), (4, 32.8e3), (7, 34.5e3), (14, 57.3e3)),
    ("bbr", 400e6): ((1, 149.5e3), (2, 171.5e3), (4, 100.7e3), (7, 61.1e3), (14, 31.9e3)),
    ("cubic", 100e6): ((1, 141.4e3), (2, 968.9e3), (4, 1496.9e3), (7, 909.3e3), (14, 731.7e3)),
}


def _nearest_rate(table: dict, congestion: str, port_bps: float) -> float | None:
    rates = [rate for cc, rate in table if cc == congestion]
    return min(rates, key=lambda rate: abs(math.log(rate / port_bps))) if rates else None


def emulated_inflight(congestion: str, port_bps: float, connections: float) -> float | None:
    """Bytes in flight per connection with `connections` meeting in one port, at the nearest measured
    port rate of this congestion control (linear between measured counts, flat past them), or None."""
    rate = _nearest_rate(EMULATED_INFLIGHT, congestion, port_bps)
    if rate is None:
        return None
    rows = EMULATED_INFLIGHT[(congestion, rate)]
    return float(np.interp(connections, [n for n, _ in rows], [b for _, b in rows]))


def emulated_queues(congestion: str, port_bps: float) -> QueueTable | None:
    """The measured table for this congestion control at the nearest measured port rate (or None)."""
    rate = _nearest_rate(EMULATED_QUEUES, congestion, port_bps)
    return EMULATED_QUEUES[(congestion, rate)] if rate is not None else None
