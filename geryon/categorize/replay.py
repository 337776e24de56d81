"""Replayed models: a worker's compute played back from a per-layer profile, with real tensors.

`ReplayedModel(profile)` owns one parameter tensor and one gradient tensor (float32) per profiled
layer that has parameters, of the profiled size times `size_scale`, and runs an iteration as
  forward:  for layer 1..L: call every wait-for-pull hook (layer index, name), then compute;
  backward: for layer L..1: compute, fill the gradient, call every ready-for-push hook
            (layer index, name, gradient tensor),
where "compute" takes the profiled time times `time_scale`, measured against a deadline (sleep
until `spin_margin` before it, 1 ms by default, then busy-wait), so work done inside the layer
(filling the gradient) counts toward its time rather than adding to it. These are the same two
points a real model exposes (a forward pre-hook per layer; a gradient hook per parameter), so a
transport drives a replayed model and a real torch model the same way: block in the pull hook until
the parameter arrived, send from the push hook. Scaling sizes by s with the bandwidth scaled by s keeps the same
transfer times with less memory and CPU. Pure compute and timing: no sockets, no transport.
"""

import time

from geryon.categorize.profiles import BYTES_PER_PARAMETER, LayerProfile
from geryon.categorize.urgency import RankedParameter
from geryon.errors import ConfigError

SLEEP_MARGIN_S = 0.001   # default busy-wait at the end of each layer (time.sleep overshoots ~0.1 ms)
BENCH_SPIN_MARGIN_S = 0.0002   # the benches' busy-wait: W spinning replays on 2 shared cores starve the rest


def wait_until(deadline: float, spin_margin: float = SLEEP_MARGIN_S) -> None:
    """Sleep, then spin the last `spin_margin` seconds, until time.perf_counter() >= deadline."""
    remaining = deadline - time.perf_counter()
    if remaining > spin_margin:
        time.sleep(remaining - spin_margin)
    while time.perf_counter() < deadline:
        pass


class ReplayedModel:
    """Profiled compute with real parameter and gradient tensors and per-layer hooks."""

    def __init__(self, profile: LayerProfile, time_scale: float = 1.0, size_scale: float = 1.0,
                 gradient_value: float = 1.0, spin_margin: float = SLEEP_MARGIN_S,
                 async_push: bool = False):
        """spin_margin: seconds of busy-wait at the end of each layer's time (sub-ms precision);
        less spinning leaves more CPU to others (several replayed workers on few cores) at the
        cost of time.sleep's overshoot. async_push: the push hooks' CPU time overlaps the next
        layers' compute (as a GPU's backward kernels run on while the CPU hands a gradient to the
        transport) instead of delaying them."""
        import torch

        if time_scale < 0 or size_scale <= 0:
            raise ConfigError(f"time_scale must be >= 0 and size_scale > 0, got {time_scale}, {size_scale}")
        if spin_margin < 0:
            raise ConfigError(f"spin_margin must be >= 0 seconds, got {spin_margin}")
        self.profile = profile
        self.time_scale = float(time_scale)
        self.size_scale = float(size_scale)
        self.gradient_value = float(gradient_value)
        self.spin_margin = float(spin_margin)
        self.async_push = bool(async_push)
        self.parameters: dict = {}
        self.gradients: dict = {}
        for layer in profile.layers:
            if layer.param_bytes > 0:
                numel = max(1, round(layer.param_bytes / BYTES_PER_PARAMETER * self.size_scale))
                self.parameters[layer.name] = torch.zeros(numel, dtype=torch.float32)
                self.gradients[layer.name] = torch.zeros(numel, dtype=torch.float32)
        self._pull_hooks = []
        self._push_hooks = []
        self._layer_hooks = []

    def add_pull_hook(self, hook) -> None:
        """hook(layer_index, layer_name): called before layer's forward; block here until pulled."""
        self._pull_hooks.append(hook)

    def add_push_hook(self, hook) -> None:
        """hook(layer_index, layer_name, gradient): called when a layer's gradient is ready."""
        self._push_hooks.append(hook)

    def add_layer_hook(self, hook) -> None:
        """hook(kind, layer_index, layer_name, start, end): a layer's compute ran from start to end
        (time.perf_counter seconds; kind "forward" or "backward"), for timelines."""
        self._layer_hooks.append(hook)

    def ranking(self) -> list[RankedParameter]:
        """Urgency ranking of the replayed tensors (forward order, scaled sizes)."""
        return [RankedParameter(name=layer.name, layer=layer.name, module_type=layer.type,
                                numel=self.parameters[layer.name].numel(),
                                bytes=self.parameters[layer.name].numel() * BYTES_PER_PARAMETER)
                for layer in self.profile.layers if layer.name in self.parameters]

    @property
    def compute_s(self) -> float:
        """Forward plus backward time of one iteration, scaled (no waiting on hooks)."""
        return (self.profile.forward_ns + self.profile.backward_ns) * 1e-9 * self.time_scale

    def forward(self) -> None:
        clock = time.perf_counter()
        for index, layer in enumerate(self.profile.layers):
            entered = time.perf_counter()
            for hook in self._pull_hooks:
                hook(index, layer.name)
            # Deadlines chain from the previous one, so wake-up overshoots do not add up;
            # time spent in a hook (blocked on a pull) does push the schedule back.
            computing = time.perf_counter()
            clock += computing - entered + layer.forward_ns * 1e-9 * self.time_scale
            wait_until(clock, self.spin_margin)
            for hook in self._layer_hooks:
                hook("forward", index, layer.name, computing, time.perf_counter())

    def backward(self) -> None:
        clock = time.perf_counter()
        for index in reversed(range(len(self.profile.layers))):
            layer = self.profile.layers[index]
            computing = time.perf_counter()
            clock += layer.backward_ns * 1e-9 * self.time_scale
            gradient = self.gradients.get(layer.name)
            if gradient is not None:
                gradient.fill_(self.gradient_value)
            wait_until(clock, self.spin_margin)
            for hook in self._layer_hooks:
                hook("backward", index, layer.name, computing, time.perf_counter())
            if gradient is not None:
                entered = time.perf_counter()
                for hook in self._push_hooks:
                    hook(index, layer.name, gradient)
                if not self.async_push:
                    clock += time.perf_counter() - entered

    def step(self) -> float:
        """One iteration (forward then backward); returns its wall-clock seconds."""
        start = time.perf_counter()
        self.forward()
        self.backward()
        return time.perf_counter() - start
