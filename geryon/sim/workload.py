"""What a simulated PS job moves: slices of the model's tensors, their servers, classes and order.

Mirrors the transport (geryon/transport/shards.py, policy.py): one tensor per profiled layer with
parameters (the categorizer's ranking); `vanilla` puts whole tensors on servers round-robin by
tensor index; the other policies cut tensors into slices of `slice_bytes` dealt round-robin over
the servers ("count" placement, as the transport does) or, as a what-if, each slice to the server
with the fewest bytes so far ("bytes" placement). Priority classes come from the categorizer:
the coarse CONV/FC split for K = 2 where the model has fully-connected layers, else thresholds.

Send order inside a connection (`send_key`, as `Policy.send_key`): FIFO for vanilla and slicing;
(class, urgency) for endhost and geryon, urgency = the tensor's position in forward order, or with
`within_class="fifo"` (class, arrival): urgency 0 for every tensor, what `bench paper`'s replayed
roles do by default (replay_roles `--within-class fifo`: only the class orders a send queue).
`geryon` alone opens one connection per class and marks it with the class's priority; the others
use one connection per peer in one network class.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geryon.categorize.classes import coarse_split, equal_thresholds, threshold_split
from geryon.categorize.profiles import LayerProfile
from geryon.errors import ConfigError
from geryon.transport.policy import PLACEMENTS, get_policy

WITHIN_CLASS = ("urgency", "fifo")


@dataclass(frozen=True)
class Workload:
    """Slices of one model under one policy: arrays indexed by slice, in plan order."""

    policy: str
    classes: int                   # K network classes in use (1 unless geryon)
    tensor_layer: np.ndarray       # layer index (forward order) of each tensor
    tensor_class: np.ndarray       # categorizer class of each tensor
    layer: np.ndarray              # per slice: layer index
    tensor: np.ndarray             # per slice: tensor index (= urgency)
    nbytes: np.ndarray             # per slice: bytes
    server: np.ndarray             # per slice: server index
    cls: np.ndarray                # per slice: categorizer class (0 most urgent)
    flow: np.ndarray               # per slice: connection index (its class under geryon, else 0)
    urgency_order: bool
    push_flow: np.ndarray | None = None   # per slice: connection of its push (default: `flow`)
    within_class: str = "urgency"  # send order inside a class: "urgency" or "fifo" (arrival)

    @property
    def slices(self) -> int:
        return len(self.nbytes)

    def bytes_per_server(self, servers: int) -> np.ndarray:
        return np.bincount(self.server, weights=self.nbytes, minlength=servers)


def tensor_classes(profile: LayerProfile, classes: int, thresholds=None) -> list[int]:
    """The categorizer's class of each tensor: coarse split for K = 2, else thresholds."""
    ranking = profile.ranking()
    if classes == 1:
        return [0] * len(ranking)
    if thresholds:
        assignment = threshold_split(ranking, thresholds)
        if assignment.classes != classes:
            raise ConfigError(f"{len(thresholds)} thresholds make {assignment.classes} classes, "
                              f"not --classes {classes}")
    elif classes == 2 and any(p.module_type.lower() in ("dense", "linear") for p in ranking[1:]):
        assignment = coarse_split(ranking)
    else:
        assignment = threshold_split(ranking, equal_thresholds(classes))
    return list(assignment.class_of)


def build_workload(profile: LayerProfile, policy: str, servers: int, slice_bytes: int,
                   classes: int = 2, thresholds=None, placement: str = "count",
                   size_scale: float = 1.0, push_class: str = "class",
                   within_class: str = "urgency") -> Workload:
    """Slices, servers and classes of `profile`'s tensors under `policy` (see module doc).

    `push_class` "high" (a what-if) sends every push in the most urgent class; pulls keep theirs.
    """
    if push_class not in ("class", "high"):
        raise ConfigError(f"push_class must be class or high, got {push_class!r}")
    if within_class not in WITHIN_CLASS:
        raise ConfigError(f"within_class must be one of {', '.join(WITHIN_CLASS)}, got {within_class!r}")
    spec = get_policy(policy)
    if placement not in PLACEMENTS:
        raise ConfigError(f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}")
    if slice_bytes < 1:
        raise ConfigError(f"slice size must be positive, got {slice_bytes}")
    if not 1 <= classes <= 8:
        raise ConfigError(f"--classes must be 1..8, got {classes}")
    layers = [i for i, layer in enumerate(profile.layers) if layer.param_bytes > 0]
    sizes = [max(1, round(profile.layers[i].param_bytes * size_scale)) for i in layers]
    klass = tensor_classes(profile, classes, thresholds)
    rows, load = [], np.zeros(servers)
    for tensor, (layer, size) in enumerate(zip(layers, sizes)):
        if not spec.spread_over_servers:
            rows.append((layer, tensor, size, tensor % servers))
            continue
        for offset in range(0, size, slice_bytes):
            length = min(slice_bytes, size - offset)
            if placement == "bytes":
                server = int(np.argmin(load))
            else:
                server = len(rows) % servers
            load[server] += length
            rows.append((layer, tensor, length, server))
    data = np.array(rows, dtype=np.int64).reshape(-1, 4)
    tensor_class = np.array(klass, dtype=np.int64)
    slice_class = tensor_class[data[:, 1]]
    network_classes = classes if spec.flow_per_class else 1
    flow = slice_class if spec.flow_per_class else np.zeros(len(data), dtype=np.int64)
    return Workload(policy=policy, classes=network_classes, tensor_layer=np.array(layers),
                    tensor_class=tensor_class, layer=data[:, 0], tensor=data[:, 1],
                    nbytes=data[:, 2], server=data[:, 3], cls=slice_class, flow=flow,
                    urgency_order=spec.urgency_order, within_class=within_class,
                    push_flow=np.zeros_like(flow) if push_class == "high" else flow)
