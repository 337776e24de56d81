"""Replayed models: profiled compute time, real tensors of the profiled sizes, per-layer hooks."""

import threading
import time

import pytest

from geryon.categorize.profiles import resolve_profile
from geryon.categorize.replay import ReplayedModel
from geryon.errors import ConfigError


def test_hooks_order_sizes_and_values():
    profile = resolve_profile("vgg19")
    model = ReplayedModel(profile, time_scale=0.01, size_scale=0.001, gradient_value=2.5)
    events = []
    model.add_pull_hook(lambda index, name: events.append(("pull", index, name)))
    model.add_push_hook(lambda index, name, grad: events.append(("push", index, name, grad.numel(),
                                                                 float(grad[0]))))
    model.step()
    pulls = [e for e in events if e[0] == "pull"]
    pushes = [e for e in events if e[0] == "push"]
    assert [e[1] for e in pulls] == list(range(19)) and [e[1] for e in pushes] == list(range(18, -1, -1))
    assert events.index(pulls[-1]) < events.index(pushes[0])  # backward after forward
    fc1 = next(e for e in pushes if e[2] == "fc1")
    assert fc1[3] == round(411058176 / 4 * 0.001) and fc1[4] == 2.5
    assert sum(p.bytes for p in model.ranking()) == pytest.approx(profile.param_bytes * 0.001, rel=1e-3)


def test_iteration_takes_the_profiled_time():
    model = ReplayedModel(resolve_profile("resnet50"), time_scale=0.5, size_scale=0.001)
    best = min(model.step() for _ in range(3))  # best of 3: other tests share the CPU
    assert model.compute_s == pytest.approx(0.5 * (42.7 + 64.3) / 1e3, rel=0.01)
    assert model.compute_s * 0.98 < best < model.compute_s * 1.5


def test_a_blocking_pull_hook_delays_the_forward_pass():
    model = ReplayedModel(resolve_profile("alexnet"), time_scale=1.0, size_scale=0.001)
    arrived = threading.Event()
    threading.Timer(0.05, arrived.set).start()
    model.add_pull_hook(lambda index, name: arrived.wait() if name == "fc6" else None)
    assert model.step() >= 0.05


def test_bad_scales():
    with pytest.raises(ConfigError):
        ReplayedModel(resolve_profile("alexnet"), size_scale=0)


def test_spin_margin_is_per_model():
    profile = resolve_profile("resnet50")
    sleeper = ReplayedModel(profile, time_scale=0.5, size_scale=0.001, spin_margin=0.0)
    spinner = ReplayedModel(profile, time_scale=0.5, size_scale=0.001, spin_margin=1.0)
    assert ReplayedModel(profile, size_scale=0.001).spin_margin == 0.001   # the replay's default
    cpu_started = time.thread_time()
    wall = sleeper.step()
    assert time.thread_time() - cpu_started < 0.5 * wall      # sleeping, not spinning
    assert wall >= sleeper.compute_s * 0.98
    assert min(spinner.step() for _ in range(3)) < spinner.compute_s * 1.5   # spinning stays on time
    with pytest.raises(ConfigError):
        ReplayedModel(profile, spin_margin=-0.001)
