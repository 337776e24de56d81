"""Analytic iteration-time model: how long an iteration takes for a given transfer priority.

Notation of the slides (layer l of L in forward order): τ_f^l, τ_b^l forward/backward compute,
τ_p^l = τ_g^l = P^l / B pull/push time of the layer's parameters over bandwidth B.

`slides_iteration_time(pull_order)` is the slides' model as written: pulls run back to back from
time 0 in the given order (t_p^l = sum of pull times up to l in that order);
t_ff^1 = t_p^1 + τ_f^1, t_ff^l = max(t_ff^{l−1}, t_p^l) + τ_f^l; t_b^l = t_ff^L + Σ_{i=l..L} τ_b^i;
t_bf^L = t_b^L + τ_g^L, t_bf^l = max(t_bf^{l+1}, t_b^l) + τ_g^l; τ_iter = t_bf^1. (The slides write
t_bf^L = t_ff^L + τ_g^L, which would push layer L's gradient before it is computed; we use t_b^L.)

`priority_iteration_time(class_of)` models what Geryon changes: the network is a strict-priority
link per direction (full duplex), FIFO within a class, higher classes pre-empting lower ones
(fluid model: pre-emption is instant). Each tensor's gradient enters the push link when the
backward pass of its layer ends (layers L..1); its updated parameter enters the pull link when its
push has finished (plus `aggregation_s`, the parameter server's work); the next forward pass of
layer l starts when the previous layer is done and all of layer l's tensors are pulled. The
iteration time is the steady-state period (forward end to forward end); the links are idle at the
end of a forward pass, so one simulated iteration gives it exactly. With one class (or t = 0 or 1)
the order on the wire is the order tensors became ready: pulls come back last-layer-first, the
ordering problem the slides describe. The model is deterministic and fast (~1 ms for ResNet-50):
it is the "measure" function tests use, and the start of the simulator.
"""

from dataclasses import dataclass

from geryon.categorize.classes import threshold_split
from geryon.categorize.profiles import LayerProfile
from geryon.errors import ConfigError


@dataclass(frozen=True)
class Tensor:
    """One transfer unit: `bytes` of layer `layer` (index in forward order)."""

    name: str
    layer: int
    bytes: int


@dataclass(frozen=True)
class Timeline:
    """Per-layer timestamps of one simulated iteration (seconds, forward end of iteration k = 0)."""

    backward_end: tuple[float, ...]   # t_b^l
    push_end: tuple[float, ...]       # t_bf^l: last tensor of layer l pushed
    pull_end: tuple[float, ...]       # t_p^l: last tensor of layer l pulled
    forward_end: tuple[float, ...]    # t_ff^l of iteration k+1
    iteration_s: float


class IterationModel:
    """Layers with compute times, tensors with sizes, and a link of `bandwidth` bits/s each way."""

    def __init__(self, forward_s, backward_s, tensors: list[Tensor], bandwidth: float,
                 aggregation_s: float = 0.0):
        if len(forward_s) != len(backward_s) or not forward_s:
            raise ConfigError("need the same, non-zero number of forward and backward times")
        if bandwidth <= 0:
            raise ConfigError(f"bandwidth must be positive, got {bandwidth}")
        if any(not 0 <= t.layer < len(forward_s) for t in tensors):
            raise ConfigError("a tensor names a layer outside the model")
        self.forward_s = tuple(float(x) for x in forward_s)
        self.backward_s = tuple(float(x) for x in backward_s)
        self.tensors = tuple(tensors)
        self.bandwidth = float(bandwidth)
        self.aggregation_s = float(aggregation_s)

    @classmethod
    def from_profile(cls, profile: LayerProfile, bandwidth: float, time_scale: float = 1.0,
                     aggregation_s: float = 0.0) -> "IterationModel":
        """One tensor per layer with parameters, named after the layer (as `LayerProfile.ranking`)."""
        tensors = [Tensor(layer.name, index, layer.param_bytes)
                   for index, layer in enumerate(profile.layers) if layer.param_bytes > 0]
        return cls([layer.forward_ns * 1e-9 * time_scale for layer in profile.layers],
                   [layer.backward_ns * 1e-9 * time_scale for layer in profile.layers],
                   tensors, bandwidth, aggregation_s)

    @property
    def layers(self) -> int:
        return len(self.forward_s)

    def transfer_s(self, size: int) -> float:
        return size * 8.0 / self.bandwidth

    def _layer_transfer_s(self) -> list[float]:
        per_layer = [0.0] * self.layers
        for tensor in self.tensors:
            per_layer[tensor.layer] += self.transfer_s(tensor.bytes)
        return per_layer

    def slides_iteration_time(self, pull_order: list[int] | None = None) -> float:
        """τ_iter of the slides' recursion; `pull_order` lists layer indices (default 0..L−1)."""
        count = self.layers
        order = list(range(count)) if pull_order is None else list(pull_order)
        if sorted(order) != list(range(count)):
            raise ConfigError(f"pull order must be a permutation of 0..{count - 1}")
        tau = self._layer_transfer_s()
        pulled, clock = [0.0] * count, 0.0
        for layer in order:
            clock += tau[layer]
            pulled[layer] = clock
        t_ff = 0.0
        for layer in range(count):
            t_ff = (pulled[layer] if layer == 0 else max(t_ff, pulled[layer])) + self.forward_s[layer]
        t_b = [0.0] * count
        acc = t_ff
        for layer in reversed(range(count)):
            acc += self.backward_s[layer]
            t_b[layer] = acc
        t_bf = t_b[count - 1] + tau[count - 1]
        for layer in reversed(range(count - 1)):
            t_bf = max(t_bf, t_b[layer]) + tau[layer]
        return t_bf

    def timeline(self, class_of: list[int]) -> Timeline:
        """Simulate one steady-state iteration with tensor i in class `class_of[i]` (0 = highest)."""
        if len(class_of) != len(self.tensors):
            raise ConfigError(f"need a class for each of the {len(self.tensors)} tensors, got {len(class_of)}")
        count = self.layers
        backward_end = [0.0] * count
        acc = 0.0
        for layer in reversed(range(count)):
            acc += self.backward_s[layer]
            backward_end[layer] = acc
        # Gradients appear last layer first; within a layer, in reverse tensor order.
        sequence = sorted(range(len(self.tensors)), key=lambda i: (-self.tensors[i].layer, -i))
        rank = {i: n for n, i in enumerate(sequence)}
        push = serve_strict_priority(
            [(backward_end[t.layer], class_of[i], rank[i], self.transfer_s(t.bytes))
             for i, t in enumerate(self.tensors)])
        pull = serve_strict_priority(
            [(push[i] + self.aggregation_s, class_of[i], rank[i], self.transfer_s(t.bytes))
             for i, t in enumerate(self.tensors)])
        push_end, pull_end = [0.0] * count, [0.0] * count
        for i, tensor in enumerate(self.tensors):
            push_end[tensor.layer] = max(push_end[tensor.layer], push[i])
            pull_end[tensor.layer] = max(pull_end[tensor.layer], pull[i])
        forward_end, clock = [0.0] * count, backward_end[0]
        for layer in range(count):
            clock = max(clock, pull_end[layer]) + self.forward_s[layer]
            forward_end[layer] = clock
        return Timeline(tuple(backward_end), tuple(push_end), tuple(pull_end), tuple(forward_end), clock)

    def priority_iteration_time(self, class_of: list[int]) -> float:
        """Steady-state seconds per iteration under strict priority with these tensor classes."""
        return self.timeline(class_of).iteration_s

    def compute_s(self) -> float:
        """Forward + backward compute: the iteration time with an infinitely fast network."""
        return sum(self.forward_s) + sum(self.backward_s)

    def threshold_measure(self, ranking, metric: str = "position"):
        """A `measure(thresholds) -> seconds`: classes split at a threshold (or K−1 of them) over `ranking`."""
        index = {t.name: i for i, t in enumerate(self.tensors)}
        missing = [p.name for p in ranking if p.name not in index]
        if missing or len(ranking) != len(self.tensors):
            raise ConfigError(f"ranking does not match the model's tensors (e.g. {missing[:3]})")

        def measure(thresholds) -> float:
            values = [float(thresholds)] if isinstance(thresholds, (int, float)) else [float(t) for t in thresholds]
            assignment = threshold_split(ranking, values, metric=metric)
            classes = [0] * len(self.tensors)
            for name, cls in zip(assignment.order, assignment.class_of):
                classes[index[name]] = cls
            return self.priority_iteration_time(classes)

        return measure


def serve_strict_priority(jobs) -> list[float]:
    """Finish time of each job (ready, class, sequence, duration) on a pre-emptive priority link."""
    finish = [0.0] * len(jobs)
    arrivals = sorted(range(len(jobs)), key=lambda i: (jobs[i][0], jobs[i][1], jobs[i][2]))
    queues: dict[int, list[int]] = {}
    remaining = [job[3] for job in jobs]
    clock, next_arrival = 0.0, 0
    while next_arrival < len(arrivals) or any(queues.values()):
        if not any(queues.values()):
            clock = max(clock, jobs[arrivals[next_arrival]][0])
        while next_arrival < len(arrivals) and jobs[arrivals[next_arrival]][0] <= clock:
            job = arrivals[next_arrival]
            queues.setdefault(jobs[job][1], []).append(job)
            next_arrival += 1
        cls = min(c for c, queue in queues.items() if queue)
        job = queues[cls][0]
        horizon = jobs[arrivals[next_arrival]][0] if next_arrival < len(arrivals) else float("inf")
        if clock + remaining[job] <= horizon:
            clock += remaining[job]
            remaining[job] = 0.0
            finish[job] = clock
            queues[cls].pop(0)
        else:
            remaining[job] -= horizon - clock
            clock = horizon
    return finish
