"""What a `bench paper --timeline` trace says about urgent tensors: how long forward passes waited.

    summary = forward_waits("vgg19-10gbe-bbr-geryon.json")

A replayed worker records a "wait <layer>" span whenever its forward pass blocked on a pulled
parameter (longer than 0.1 ms), next to its per-layer compute spans. Per trace: the iterations seen
(forward passes of the first layer, per worker), the mean wait per worker-iteration in total and
on the first layer (the most urgent tensor, the one every iteration starts with), and the mean wait
per layer. Comparing the same cell under `endhost` and `geryon` shows how long urgent tensors wait
behind bulk under each policy.
"""

from __future__ import annotations

import json
from collections import defaultdict


def forward_waits(path) -> dict:
    with open(path) as handle:
        events = json.load(handle)["traceEvents"]
    first_layer = None
    starts = 0
    by_layer: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("ph") != "X":
            continue
        if event.get("cat") == "forward":
            layer = event["name"].split(" ", 1)[1]
            if first_layer is None:
                first_layer = layer
            if layer == first_layer:
                starts += 1
        elif event.get("cat") == "wait":
            by_layer[event["name"].split(" ", 1)[1]] += event["dur"] / 1e6
    iterations = max(1, starts)
    total = sum(by_layer.values())
    return {"worker_iterations": starts, "wait_s_per_iteration": total / iterations,
            "first_layer": first_layer,
            "first_layer_wait_s": by_layer.get(first_layer, 0.0) / iterations if first_layer else 0.0,
            "by_layer_s": {layer: seconds / iterations for layer, seconds in
                           sorted(by_layer.items(), key=lambda item: -item[1])}}
