"""The user's optimizer on the parameter servers: its description as data, who steps, and exactness on
loopback servers (per-iteration settings, skipped tensors, clipping by the global norm over 2 servers,
optimizer state saved and loaded through the shards)."""

import threading

import pytest
import torch

from geryon.errors import ConfigError
from geryon.runtime.ps_optimizer import choose_update
from geryon.transport.config import TransportConfig
from geryon.transport.ps_server import ParameterServer
from geryon.transport.ps_worker import PSWorker
from transport_support import run_ps_workers
from geryon.transport.server_optimizer import (STEP_HEADER, OptimizerSpec, check_groups, describe_optimizer,
                                       full_state, hyper_vector, shard_state)


def _model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _bound_model(local):
    """The test model whose parameters are a worker's tensors (the pulls land in them)."""
    model = _model()
    for param, tensor in zip(model.parameters(), local):
        param.data = tensor
    return model


def _servers_start(optimizer_class, settings):
    """The servers' optimizer spec and starting values (the test model's) and the transport config."""
    model0 = _model()
    spec = describe_optimizer(optimizer_class(model0.parameters(), **settings), list(model0.parameters()))
    initial = [p.detach().clone() for p in model0.parameters()]
    return spec, initial, TransportConfig(secret="t", policy="geryon", slice_bytes=1024, timeout=20)


class Scaled(torch.optim.SGD):
    """A subclass may change step(): not on the allow-list."""


def test_who_steps():
    params = list(_model().parameters())
    assert choose_update(torch.optim.Adam(params), params)[0] == "server"
    assert choose_update(torch.optim.Adam(params), params, "worker")[0] == "worker"
    mode, spec, why = choose_update(Scaled(params, lr=0.1), params)
    assert (mode, spec) == ("worker", None) and "Scaled" in why
    assert choose_update(torch.optim.SGD(params, lr=torch.tensor(0.1)), params)[0] == "worker"
    with pytest.raises(ConfigError, match="--ps-optimizer server: Scaled"):
        choose_update(Scaled(params, lr=0.1), params, "server")
    with pytest.raises(ConfigError, match="LBFGS"):
        choose_update(torch.optim.LBFGS(params), params)
    with pytest.raises(ConfigError, match="not one of the model's parameters"):
        choose_update(torch.optim.SGD(params + [torch.nn.Parameter(torch.zeros(2))], lr=0.1), params)


def test_spec_is_json_with_an_allow_list():
    params = list(_model().parameters())
    optimizer = torch.optim.Adam([{"params": params[:2], "lr": 0.1}, {"params": params[3:]}],
                                 betas=(0.8, 0.9), amsgrad=True)
    spec = describe_optimizer(optimizer, params)
    assert spec.tensor_group == (0, 0, -1, 1)
    again = OptimizerSpec.from_json(spec.to_json())
    assert again.groups == spec.groups and again.tensor_group == spec.tensor_group
    assert again.build(0, torch.zeros(3)).param_groups[0]["betas"] == (0.8, 0.9)
    bad = spec.to_json().replace('"Adam"', '"os.system"')
    with pytest.raises(ConfigError, match="cannot run on the parameter servers"):
        OptimizerSpec.from_json(bad)


def test_group_changes_numbers_yes_structure_no():
    params = list(_model().parameters())
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    spec = describe_optimizer(optimizer, params)
    optimizer.param_groups[0]["lr"] = 0.05
    optimizer.param_groups[0]["initial_lr"] = 0.1          # a scheduler made later: ignored
    assert 0.05 in hyper_vector(check_groups(optimizer.param_groups, spec), spec)
    optimizer.param_groups[0]["foreach"] = True
    with pytest.raises(ConfigError, match="'foreach' changed"):
        check_groups(optimizer.param_groups, spec)
    optimizer.param_groups[0]["foreach"] = None
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    with pytest.raises(ConfigError, match="2 parameter groups"):
        check_groups(optimizer.param_groups, spec)


def test_state_splits_into_shards_and_back():
    param = torch.nn.Parameter(torch.randn(4, 5))
    optimizer = torch.optim.Adam([param])
    param.grad = torch.randn(4, 5)
    optimizer.step()
    state = optimizer.state[param]
    parts = [(0, shard_state(state, param, 0, 7)), (7, shard_state(state, param, 7, 13))]
    assert parts[1][1]["exp_avg"].shape == (13,) and parts[1][1]["step"].dim() == 0
    whole = full_state(parts, param)
    assert all(torch.equal(whole[k], state[k]) for k in state)


def _serve(workers, params, config, spec, work):
    """Two servers with STEP frames and an in-process norm exchange; `work(rank, worker, local)`."""
    servers = 2
    partials, barrier = {}, threading.Barrier(servers)

    def exchange(iteration, partial, index):
        partials[(iteration, index)] = partial
        barrier.wait(20)
        return [partials[(iteration, j)] for j in range(servers)]

    started = [ParameterServer(s, servers, workers, params, config, ("127.0.0.1", 0), optimizer=spec,
                               step_frames=True,
                               norm_exchange=lambda i, p, s=s: exchange(i, p, s))
               for s in range(servers)]
    return run_ps_workers(started, workers, params,
                          lambda rank, addresses, local: PSWorker(rank, workers, addresses, local, config), work)


def test_step_and_pull_sent_ahead_with_absent_tensors_follow_one_process():
    """--ps-pull ahead on the wire: STEP (every tensor marked present) and the pull of i + 1 leave
    before any push of i; a tensor without a gradient is an ABSENT frame per shard, and one that no
    worker has a gradient for is left alone (Adam with weight decay would move it otherwise)."""
    workers, iterations, batch = 2, 4, 4
    settings = dict(lr=0.01, weight_decay=0.1)
    torch.manual_seed(5)
    inputs = torch.randn(iterations, workers * batch, 10)
    lrs = [0.01, 0.02, 0.005, 0.01]
    uses_head = [True, False, True, False]

    def loss_of(model, x, i):
        hidden = model[1](model[0](x))
        return model[2](hidden).square().mean() if uses_head[i] else hidden.square().mean()

    reference = _model()
    optimizer = torch.optim.Adam(reference.parameters(), **settings)
    for i in range(iterations):
        optimizer.param_groups[0]["lr"] = lrs[i]
        optimizer.zero_grad(set_to_none=True)
        loss_of(reference, inputs[i], i).backward()
        optimizer.step()
    spec, initial, config = _servers_start(torch.optim.Adam, settings)

    def work(rank, worker, local):
        model = _bound_model(local)
        part = slice(rank * batch, (rank + 1) * batch)
        for i in range(iterations):
            worker.wait_all()
            groups = [dict(spec.groups[0], lr=lrs[i])]
            worker.send_step(torch.tensor([0.0, 0.0, 0.0, *hyper_vector(groups, spec), *[1.0] * len(local)],
                                          dtype=torch.float64))
            worker.pull(i + 1)
            model.zero_grad(set_to_none=True)
            loss_of(model, inputs[i][part], i).backward()
            for tensor, param in enumerate(model.parameters()):
                if param.grad is None:
                    worker.push_absent(tensor)
                else:
                    worker.push_tensor(tensor, param.grad)
            worker.iteration += 1
        worker.wait_all()
        return [p.detach().clone() for p in model.parameters()]

    for result in _serve(workers, initial, config, spec, work):
        for got, want in zip(result, reference.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def test_a_malformed_or_untimely_absent_frame_is_a_protocol_error():
    """ABSENT is validated like a push: its shard must exist, the iteration be the shard's, once."""
    from types import SimpleNamespace

    from geryon.errors import ProtocolError
    from geryon.transport.wire import Kind, decode_header, encode_control

    params = [torch.zeros(6)]
    config = TransportConfig(secret="t", slice_bytes=1024, timeout=5)
    server = ParameterServer(0, 1, 2, params, config, ("127.0.0.1", 0), step_frames=True)
    try:
        flow = SimpleNamespace(peer_id=0, name="worker0")
        server.joined.add(0)

        def absent(payload, iteration=0, tensor=0):
            frame = encode_control(Kind.ABSENT, payload, job_id=config.job_id, iteration=iteration,
                                   tensor_id=tensor)
            header = decode_header(frame[:44], job_id=config.job_id, max_payload=1 << 20)
            server.control(flow, header, payload)

        with pytest.raises(ProtocolError, match="malformed ABSENT"):
            absent(b"\x00")
        with pytest.raises(ProtocolError, match="names no shard"):
            absent((3).to_bytes(8, "big"))
        with pytest.raises(ProtocolError, match="out of step"):
            absent((0).to_bytes(8, "big"), iteration=1)
        absent((0).to_bytes(8, "big"))
        with pytest.raises(ProtocolError, match="already pushed"):
            absent((0).to_bytes(8, "big"))
        assert server.shards[(0, 0)].version == 0   # one of two workers: not complete
    finally:
        server.close()

@pytest.mark.parametrize("name", ["Adam", "RMSprop", "SGD"])
def test_schedule_clipping_and_unused_tensors_follow_one_process(name):
    """Per-step learning rates, clipping by the global norm and a frozen-by-usage layer, 2 servers."""
    workers, iterations, batch = 2, 5, 4
    settings = {"Adam": dict(lr=0.01, amsgrad=True), "RMSprop": dict(lr=0.01, momentum=0.5),
                "SGD": dict(lr=0.1, momentum=0.9, weight_decay=0.01)}[name]
    torch.manual_seed(5)
    inputs = torch.randn(iterations, workers * batch, 10)
    labels = torch.randint(0, 3, (iterations, workers * batch))
    lrs = [settings["lr"] * f for f in (1.0, 0.5, 0.25, 2.0, 1.0)]
    uses_head = [True, False, True, True, False]   # in some steps the last layer gets no gradient

    def loss_of(model, x, y, i):
        hidden = model[1](model[0](x))
        return torch.nn.functional.cross_entropy(model[2](hidden), y) if uses_head[i] else hidden.square().mean()

    reference = _model()
    optimizer = getattr(torch.optim, name)(reference.parameters(), **settings)
    for i in range(iterations):
        optimizer.param_groups[0]["lr"] = lrs[i]
        optimizer.zero_grad(set_to_none=True)
        loss_of(reference, inputs[i], labels[i], i).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.1)
        optimizer.step()
    spec, initial, config = _servers_start(getattr(torch.optim, name), settings)

    def work(rank, worker, local):
        model = _bound_model(local)
        part = slice(rank * batch, (rank + 1) * batch)
        for i in range(iterations):
            worker.wait_all()
            model.zero_grad(set_to_none=True)
            loss_of(model, inputs[i][part], labels[i][part], i).backward()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
            groups = [dict(spec.groups[0], lr=lrs[i])]
            presence = [1.0 if p.grad is not None else 0.0 for p in model.parameters()]
            worker.send_step(torch.tensor([1.0, 0.1, 2.0, *hyper_vector(groups, spec), *presence],
                                          dtype=torch.float64))
            worker.step(grads)
        worker.wait_all()
        return [p.detach().clone() for p in model.parameters()]

    assert STEP_HEADER == 3
    for result in _serve(workers, initial, config, spec, work):
        for got, want in zip(result, reference.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
