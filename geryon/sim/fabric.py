"""The simulated network: hosts, their NIC links, leaf uplinks, and how link capacity is shared.

A `Fabric` is data: per host an up link (host to switch) and a down link (switch to host) of
`link_bps`; in a leaf-spine fabric, per leaf an up link (leaf to spine layer) and a down link of
`leaf_bps` (hosts per leaf x link rate / oversubscription). The spine layer itself is non-blocking.
Each host is a worker host, a server host, or both (the colocated layout).

`allocate` gives the rate of every active *flow group*. A group is the set of identical
connections that carry one PS server's traffic in one direction and one class: pushes from every
remote worker into server s, or pulls from s to every remote worker. By the symmetry of a
synchronous PS on identical workers, every member of a group carries the same frame at the same
time; so each member gets the same rate (the group's), and the group has one member on the link
of every worker host except the server's own, and all its members on the server's link. That keeps
the state per server, not per (worker, server) pair, which is what makes 1024 workers cheap.

Sharing: strict priority between classes at every port (class 0 first, each next class gets what
is left), max-min fair between groups' members inside a class (progressive filling: all unfrozen
members grow together until a link saturates; the groups crossing it freeze). A group whose
members cross different worker links is held to the slowest of them: in synchronous PS a slice is
updated only when every worker's push has arrived, so the slowest member decides anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from geryon.errors import ConfigError

SATURATED = 1e-9   # a link with less than this fraction of its capacity left is full


@dataclass(frozen=True)
class Fabric:
    """Hosts with up/down links of `link_bps`; `leaf_of` (hosts) and `leaf_bps` for leaf-spine."""

    link_bps: float
    is_worker: np.ndarray        # bool per host
    server_host: np.ndarray      # host index of each server
    leaf_of: np.ndarray | None = None   # leaf index per host (None: a single star switch)
    leaf_bps: float = math.inf

    @property
    def hosts(self) -> int:
        return len(self.is_worker)

    @property
    def workers(self) -> int:
        return int(self.is_worker.sum())

    @property
    def leaves(self) -> int:
        return 0 if self.leaf_of is None else int(self.leaf_of.max()) + 1

    def describe(self) -> str:
        text = f"{self.hosts} hosts at {self.link_bps / 1e9:g} Gbit/s"
        if self.leaf_of is not None:
            text += (f", {self.leaves} leaves, leaf uplink {self.leaf_bps / 1e9:g} Gbit/s each way")
        return text


def build_fabric(workers: int, servers: int, layout: str, link_bps: float, topology: str = "star",
                 oversubscription: float = 1.0, hosts_per_leaf: int | None = None) -> Fabric:
    """A star or leaf-spine fabric for `workers` workers and `servers` PS servers."""
    if workers < 1 or servers < 1:
        raise ConfigError("need at least one worker and one server")
    if link_bps <= 0:
        raise ConfigError(f"link rate must be positive, got {link_bps}")
    if layout == "colocated":
        if servers > workers:
            raise ConfigError("colocated layout: at most one server per worker host")
        is_worker = np.ones(workers, dtype=bool)
        server_host = np.arange(servers)
    elif layout == "separate":
        is_worker = np.concatenate([np.ones(workers, dtype=bool), np.zeros(servers, dtype=bool)])
        server_host = np.arange(workers, workers + servers)
    else:
        raise ConfigError(f"unknown layout {layout!r}; use colocated or separate")
    if topology == "star":
        return Fabric(float(link_bps), is_worker, server_host)
    if topology != "leafspine":
        raise ConfigError(f"unknown topology {topology!r}; use star or leafspine")
    if oversubscription < 1:
        raise ConfigError(f"oversubscription must be >= 1, got {oversubscription}")
    hosts = len(is_worker)
    per_leaf = hosts_per_leaf or max(1, min(16, math.ceil(hosts / 2)))
    if per_leaf < 1:
        raise ConfigError("hosts per leaf must be at least 1")
    # workers and servers are dealt over the leaves alike, so every leaf holds both kinds
    leaf_of = np.empty(hosts, dtype=np.int64)
    leaves = math.ceil(hosts / per_leaf)
    for kind in (is_worker, ~is_worker):
        members = np.flatnonzero(kind)
        leaf_of[members] = np.arange(len(members)) % leaves
    return Fabric(float(link_bps), is_worker, server_host, leaf_of,
                  per_leaf * float(link_bps) / oversubscription)


class GroupSet:
    """Static facts of every flow group: its server's host, direction, class, members, crossings."""

    def __init__(self, fabric: Fabric, host: np.ndarray, pull: np.ndarray, cls: np.ndarray,
                 worker_host: np.ndarray | None = None):
        """`worker_host` >= 0 makes a group ONE connection between that worker host and the
        server (the exact, per-connection model); -1 (or None) the aggregate of all workers."""
        self.fabric = fabric
        self.host = np.asarray(host, dtype=np.int64)
        self.pull = np.asarray(pull, dtype=bool)
        self.cls = np.asarray(cls, dtype=np.int64)
        self.worker_host = (np.full(len(self.host), -1, dtype=np.int64) if worker_host is None
                            else np.asarray(worker_host, dtype=np.int64))
        own_worker = fabric.is_worker[self.host]
        self.exact = self.worker_host >= 0
        self.members = np.where(self.exact, (self.worker_host != self.host).astype(np.int64),
                                fabric.workers - own_worker.astype(np.int64))
        self.own_worker = own_worker
        if fabric.leaf_of is not None:
            self.leaf = fabric.leaf_of[self.host]
            self.workers_on_leaf = np.bincount(fabric.leaf_of[fabric.is_worker],
                                               minlength=fabric.leaves).astype(np.int64)
            self.cross = fabric.workers - self.workers_on_leaf[self.leaf]
            if self.exact.any():
                raise ConfigError("the exact per-connection model supports the star topology only")
        else:
            self.leaf = np.zeros(len(self.host), dtype=np.int64)
            self.workers_on_leaf = None
            self.cross = np.zeros(len(self.host), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.host)


def allocate(groups: GroupSet, active: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Bytes/s per member of each group in `active` (indices): strict priority, then max-min.

    `floor` > 0 first guarantees every class that fraction of every port (as an HTB class's
    `rate` does under its `ceil`), then hands out the rest by strict priority.
    """
    if floor <= 0 or len(np.unique(groups.cls[active])) < 2:
        return _fill(groups, active, 1.0)[0]
    first, left = _fill(groups, active, floor, per_class=True)
    second, _ = _fill(groups, active, 1.0, residual=left)
    return first + second


def _fill(groups: GroupSet, active: np.ndarray, share: float, per_class: bool = False,
          residual=None):
    """Progressive filling class by class; `share` of each port per class when per_class."""
    fabric = groups.fabric
    hosts, leaves = fabric.hosts, fabric.leaves
    cap = fabric.link_bps / 8.0
    leafy = fabric.leaf_of is not None
    if residual is None:
        residual = [np.full(hosts, cap * share), np.full(hosts, cap * share)]
        if leafy:
            residual += [np.full(leaves, fabric.leaf_bps / 8.0 * share)] * 2
        residual = [r.copy() for r in residual]
    full = [r.copy() for r in residual]
    residual_up, residual_down = residual[0], residual[1]
    if leafy:
        residual_lup, residual_ldown = residual[2], residual[3]
        wol = groups.workers_on_leaf
        has_workers = wol > 0
    is_worker = fabric.is_worker
    rates = np.zeros(len(active))
    used = [np.zeros_like(r) for r in residual]
    classes = groups.cls[active]
    for klass in np.unique(classes):
        if per_class:   # every class starts from its own guaranteed share
            for r, f in zip(residual, full):
                r[:] = f
        sel = np.flatnonzero(classes == klass)
        idx = active[sel]
        host, pull, members = groups.host[idx], groups.pull[idx], groups.members[idx]
        own = groups.own_worker[idx]
        exact = groups.exact[idx]
        wh = np.where(exact, groups.worker_host[idx], 0)
        push = ~pull
        if leafy:
            leaf, cross = groups.leaf[idx], groups.cross[idx]
        free = np.ones(len(idx), dtype=bool)
        rate = np.zeros(len(idx))
        while free.any():
            fpush, fpull = free & push & ~exact, free & pull & ~exact
            epush, epull = free & push & exact, free & pull & exact
            # members per link among the unfrozen groups
            n_up = (is_worker * (fpush.sum() - np.bincount(host[fpush], minlength=hosts))
                    + np.bincount(host[fpull | epull], weights=members[fpull | epull], minlength=hosts)
                    + np.bincount(wh[epush], minlength=hosts))
            n_down = (is_worker * (fpull.sum() - np.bincount(host[fpull], minlength=hosts))
                      + np.bincount(host[fpush | epush], weights=members[fpush | epush], minlength=hosts)
                      + np.bincount(wh[epull], minlength=hosts))
            shares = [_share(residual_up, n_up), _share(residual_down, n_down)]
            if leafy:
                n_lup = (wol * (fpush.sum() - np.bincount(leaf[fpush], minlength=leaves))
                         + np.bincount(leaf[fpull], weights=cross[fpull], minlength=leaves))
                n_ldown = (wol * (fpull.sum() - np.bincount(leaf[fpull], minlength=leaves))
                           + np.bincount(leaf[fpush], weights=cross[fpush], minlength=leaves))
                shares += [_share(residual_lup, n_lup), _share(residual_ldown, n_ldown)]
            delta = min(shares)
            if not math.isfinite(delta):   # no link constrains them (cannot happen with members)
                break
            rate[free] += delta
            residual_up -= n_up * delta
            residual_down -= n_down * delta
            sat_up = (residual_up <= SATURATED * cap) & (n_up > 0)
            sat_down = (residual_down <= SATURATED * cap) & (n_down > 0)
            worker_up_full = int((sat_up & is_worker).sum())
            worker_down_full = int((sat_down & is_worker).sum())
            frozen = np.where(push,
                              sat_down[host] | np.where(exact, sat_up[wh],
                                                        worker_up_full - (sat_up[host] & own) > 0),
                              sat_up[host] | np.where(exact, sat_down[wh],
                                                      worker_down_full - (sat_down[host] & own) > 0))
            if leafy:
                residual_lup -= n_lup * delta
                residual_ldown -= n_ldown * delta
                sat_lup = (residual_lup <= SATURATED * fabric.leaf_bps / 8) & (n_lup > 0)
                sat_ldown = (residual_ldown <= SATURATED * fabric.leaf_bps / 8) & (n_ldown > 0)
                lup_full = int((sat_lup & has_workers).sum())
                ldown_full = int((sat_ldown & has_workers).sum())
                mine_up = sat_lup[leaf] & has_workers[leaf]
                mine_down = sat_ldown[leaf] & has_workers[leaf]
                frozen |= np.where(push,
                                   (sat_ldown[leaf] & (cross > 0)) | (lup_full - mine_up > 0),
                                   (sat_lup[leaf] & (cross > 0)) | (ldown_full - mine_down > 0))
            newly = free & frozen
            if not newly.any():   # numerical corner: freeze the tightest to make progress
                newly = free
            free &= ~newly
        np.maximum(residual_up, 0, out=residual_up)
        np.maximum(residual_down, 0, out=residual_down)
        rates[sel] = rate
        if per_class:
            for r, f, u in zip(residual, full, used):
                u += f - r
    if per_class:
        residual = [np.maximum(f0 / share - u, 0) for f0, u in zip(full, used)]
    return rates, residual


def _share(residual: np.ndarray, count: np.ndarray) -> float:
    """The smallest equal increment that fills one of these links (inf when none is used)."""
    used = count > 0
    if not used.any():
        return math.inf
    return float((np.maximum(residual[used], 0.0) / count[used]).min())
