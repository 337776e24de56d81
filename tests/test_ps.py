"""Parameter-server mode on loopback: exact aggregation, and training equal to one process."""

import time

import pytest
import torch

from geryon.errors import ProtocolError
from geryon.transport.config import TransportConfig
from geryon.transport.ps_server import ParameterServer
from geryon.transport.ps_worker import PSWorker
from transport_support import run_ps_workers


def run_ps(workers, servers, params, config, priorities, work, worker_class=PSWorker, worker_device=None,
           stage_host=False, server_device="cpu", **sgd):
    """Start `servers` servers and `workers` worker threads running work(rank, worker, local); each
    worker's `local` parameters are on `worker_device` (None: the CPU)."""
    started = [ParameterServer(s, servers, workers, params, config, ("127.0.0.1", 0), priorities,
                               device=server_device, **sgd)
               for s in range(servers)]

    def open_worker(rank, addresses, local):
        if worker_device is not None:
            local[:] = [t.to(worker_device) for t in local]
        extra = {"stage_host": True} if stage_host else {}
        return worker_class(rank, workers, addresses, local, config, priorities, **extra)

    return run_ps_workers(started, workers, params, open_worker, work)


@pytest.mark.parametrize("policy", ["vanilla", "geryon"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_aggregate_is_bit_exact_mean(policy, dtype):
    """lr=1 from zero parameters: the pulled value is minus the mean, summed in worker order."""
    workers, sizes = 3, (5, 3001, 1)
    config = TransportConfig(secret="t", policy=policy, slice_bytes=1024, timeout=20)
    params = [torch.zeros(n, dtype=dtype) for n in sizes]
    grads = [[torch.randn(n).to(dtype) for n in sizes] for _ in range(workers)]

    def work(rank, worker, local):
        worker.step(grads[rank])
        worker.wait_all()
        return [t.clone() for t in local]

    results = run_ps(workers, 2, params, config, [0, 1, 0], work, lr=1.0)
    for i in range(len(sizes)):
        mean = grads[0][i].clone()
        for w in range(1, workers):
            mean.add_(grads[w][i])
        mean.div_(workers)
        want = torch.zeros_like(mean).add_(mean, alpha=-1.0)
        for got in results:
            assert torch.equal(got[i], want)


def _model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))


SGD_SETTINGS = dict(lr=0.1, momentum=0.9, weight_decay=0.01)


def _train_ps(policy, device=None, **ps):
    """3 workers x 4 iterations of _model() against 2 servers; each worker's final parameters (CPU)
    and the single process's parameters on the concatenated batches (on `device`)."""
    workers, iterations, batch = 3, 4, 8
    torch.manual_seed(5)
    inputs = torch.randn(iterations, workers * batch, 10, device=device)
    labels = torch.randint(0, 3, (iterations, workers * batch), device=device)
    reference = _model().to(device)
    optimizer = torch.optim.SGD(reference.parameters(), **SGD_SETTINGS)
    for i in range(iterations):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(inputs[i]), labels[i]).backward()
        optimizer.step()
    config = TransportConfig(secret="t", policy=policy, slice_bytes=1024, timeout=20)
    initial = [p.detach().clone() for p in _model().parameters()]

    def work(rank, worker, local):
        model = _model().to(device)
        for p, t in zip(model.parameters(), local):
            p.data = t                      # the worker writes pulled values into these tensors
        part = slice(rank * batch, (rank + 1) * batch)
        for i in range(iterations):
            for layer in range(len(local)):
                worker.wait_param(layer)
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs[i][part]), labels[i][part]).backward()
            worker.step([p.grad for p in model.parameters()])
        worker.wait_all()
        staged = ps.get("stage_host") or device is not None
        assert (worker.staging_bytes > 0) == staged     # staged: through the flows' slots
        return [p.detach().cpu() for p in model.parameters()]

    results = run_ps(workers, 2, initial, config, [0, 0, 1, 1], work, worker_device=device, **ps, **SGD_SETTINGS)
    return results, [p.detach().cpu() for p in reference.parameters()]


@pytest.mark.parametrize("policy", ["vanilla", "slicing", "endhost", "geryon"])
def test_sync_training_equals_single_process(policy):
    results, reference = _train_ps(policy)
    for result in results:
        for got, want in zip(result, reference):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("policy", ["vanilla", "geryon"])
def test_staged_workers_train_bit_equal_to_workers_reading_in_place(policy):
    """`stage_host=True` runs a GPU worker's pipeline on host buffers: each pushed shard copied into
    a slot of its flow when its turn comes, each pulled shard landed in a slot and copied into the
    parameter; the same bits as the worker that sends from and lands in the tensors themselves."""
    staged, _ = _train_ps(policy, stage_host=True)
    direct, _ = _train_ps(policy)
    for got, want in zip(staged, direct):
        assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.cuda
@pytest.mark.parametrize("server_device", ["cpu", "cuda"])
def test_cuda_workers_train_as_one_cuda_process(server_device):
    """Workers' models on the GPU (gradients pushed and parameters pulled through pinned slots on
    side streams, the per-layer waits on CUDA events), servers on the CPU or on the GPU."""
    results, reference = _train_ps("geryon", torch.device("cuda", 0), server_device=server_device)
    for result in results:
        for got, want in zip(result, reference):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("server_device", ["cpu", "cuda"])
def test_cuda_workers_pull_the_bit_exact_mean(server_device):
    """lr=1 from zero: CUDA workers get minus the mean of their gradients, summed on the servers in
    worker order, bit for bit, whether a server holds its shards on the CPU or the GPU."""
    workers, sizes = 3, (5, 3001, 1)
    config = TransportConfig(secret="t", policy="geryon", slice_bytes=1024, timeout=30)
    params = [torch.zeros(n) for n in sizes]
    grads = [[torch.randn(n) for n in sizes] for _ in range(workers)]
    device = torch.device("cuda", 0)

    def work(rank, worker, local):
        torch.cuda.set_device(device)
        worker.step([g.to(device) for g in grads[rank]])
        worker.wait_all()
        assert all(t.device == device for t in local)
        return [t.cpu() for t in local]

    results = run_ps(workers, 2, params, config, [0, 1, 0], work, worker_device=device,
                     server_device=server_device, lr=1.0)
    for i in range(len(sizes)):
        mean = grads[0][i].clone()
        for w in range(1, workers):
            mean.add_(grads[w][i])
        mean.div_(workers)
        for got in results:
            assert torch.equal(got[i], -mean)


def test_mismatched_shard_plan_is_refused():
    config = TransportConfig(secret="t", timeout=10)
    server = ParameterServer(0, 1, 1, [torch.zeros(10)], config, ("127.0.0.1", 0))
    try:
        with pytest.raises(ProtocolError, match="another parameter shard plan"):
            PSWorker(0, 1, [("127.0.0.1", server.port)], [torch.zeros(11)], config)
    finally:
        server.close()


def test_servers_and_workers_placing_slices_differently_are_refused():
    """Round-robin and byte-balanced plans differ on alternating big and small tensors: a worker with
    the other placement is refused by the plan digest, before any gradient moves."""
    params = [torch.zeros(256), torch.zeros(2), torch.zeros(256), torch.zeros(2)]   # one slice each
    servers = [ParameterServer(s, 2, 1, params, TransportConfig(secret="t", timeout=10, slice_bytes=1024,
                                                                 placement="bytes"), ("127.0.0.1", 0))
               for s in range(2)]
    try:
        count = TransportConfig(secret="t", timeout=10, slice_bytes=1024, placement="count")
        with pytest.raises(ProtocolError, match="another parameter shard plan"):
            PSWorker(0, 1, [("127.0.0.1", s.port) for s in servers], params, count)
    finally:
        for server in servers:
            server.close()


@pytest.mark.parametrize("cls,settings", [
    ("SGD", dict(lr=0.1)), ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.1)), ("AdamW", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True)), ("Adagrad", dict(lr=0.1)),
    ("NAdam", dict(lr=0.01)), ("Rprop", dict(lr=0.01))])
def test_server_update_is_bit_exact_torch_optim(cls, settings):
    """A shard's update equals the user's torch.optim class on the whole tensor, bit for bit."""
    from geryon.transport.ps_server import ServerShard, StepPlan
    from geryon.transport.server_optimizer import describe_optimizer
    from geryon.transport.shards import Shard

    torch.manual_seed(3)
    start = torch.randn(257)
    reference = torch.nn.Parameter(start.clone())
    optimizer = getattr(torch.optim, cls)([reference], **settings)
    spec = describe_optimizer(optimizer, [reference])
    halves = [ServerShard(Shard(0, offset, length, 0, 0, 0), start[offset:offset + length], 1, spec, 0)
              for offset, length in ((0, 128), (128, 129))]
    for _ in range(5):
        grad = torch.randn(257)
        reference.grad = grad.clone()
        optimizer.step()
        for half in halves:
            o, n = half.shard.offset, half.shard.length
            half.update(grad[o:o + n].clone(), StepPlan(), spec, [0])
        assert torch.equal(torch.cat([h.param for h in halves]), reference.detach())


def test_a_shards_mean_gradient_is_exact_and_lands_in_one_buffer_made_at_its_first_update():
    """The mean of the workers' gradients, summed in worker order then divided, bit for bit, in the
    same buffer at every update (a fresh one per update cost page faults for big shards)."""
    from geryon.transport.ps_server import ServerShard
    from geryon.transport.server_optimizer import describe_optimizer
    from geryon.transport.shards import Shard

    torch.manual_seed(5)
    value = torch.nn.Parameter(torch.randn(1000))
    spec = describe_optimizer(torch.optim.SGD([value], lr=0.1), [value])
    shard = ServerShard(Shard(0, 0, 1000, 0, 0, 0), value.detach(), 3, spec, 0)
    assert shard.mean is None
    means = []                         # held, so a fresh tensor per update could not reuse memory
    for _ in range(3):
        for grad in shard.grads:
            grad.copy_(torch.randn(1000))
        expected = ((shard.grads[0] + shard.grads[1]) + shard.grads[2]) / 3
        means.append(shard.mean_gradient())
        assert torch.equal(means[-1], expected)
    assert all(mean is means[0] for mean in means)


@pytest.mark.timing
def test_a_pull_racing_a_class_flows_registration_still_gets_its_parameters(monkeypatch):
    """A worker's PULL (flow 0) can reach the server while its class-1 flow is between ACCEPT and
    registration: the server waits for that flow instead of skipping the parameter (a 60 s hang once)."""
    from geryon.transport.flows import FlowPool

    register = FlowPool._register

    def late_class_flow(pool, sock, peer_id, index, name):
        if pool.peer_label == "worker" and index == 1:
            time.sleep(1.0)            # the server side of class flow 1: ACCEPT sent, not yet registered
        register(pool, sock, peer_id, index, name)

    monkeypatch.setattr(FlowPool, "_register", late_class_flow)
    config = TransportConfig(secret="t", policy="geryon", slice_bytes=1024, timeout=20)
    params = [torch.zeros(n) for n in (5, 3001)]
    grads = [[torch.full((n,), float(w + 1)) for n in (5, 3001)] for w in range(2)]

    def work(rank, worker, local):
        worker.pull()              # the start-up pull: its PARAMs go out on both class flows at once
        worker.wait_all()
        worker.step(grads[rank])
        worker.wait_all()
        return [t.clone() for t in local]

    started = time.monotonic()
    for got in run_ps(2, 1, params, config, [0, 1], work, lr=1.0):
        assert torch.equal(got[0], torch.full((5,), -1.5)) and torch.equal(got[1], torch.full((3001,), -1.5))
    assert time.monotonic() - started < 15, "a parameter waited for the transport timeout"


@pytest.mark.parametrize("policy", ["vanilla", "geryon"])
def test_a_pull_asked_before_the_pushes_is_answered_as_each_update_is_made(policy):
    """bench paper's `--pull ahead`: a worker asks for version i + 1 with its first push of iteration
    i (LayerwisePSWorker); every server answers each shard once its update is made, and training is
    exactly what pulling after the last push gives."""
    from geryon.bench.replay_roles import LayerwisePSWorker

    workers, sizes, iterations = 3, (5, 3001, 700), 3
    config = TransportConfig(secret="t", policy=policy, slice_bytes=1024, timeout=20)
    params = [torch.zeros(n) for n in sizes]
    torch.manual_seed(3)
    grads = [[[torch.randn(n) for n in sizes] for _ in range(workers)] for _ in range(iterations)]

    def train(ahead):
        def work(rank, worker, local):
            worker.pull_ahead = ahead
            for i in range(iterations):
                worker.wait_all()
                for tensor in reversed(range(len(sizes))):     # backward order, as the replay pushes
                    worker.push_tensor(tensor, grads[i][rank][tensor])
                    if ahead:
                        assert worker.pull_iteration == i + 1   # asked with the first push
                worker.next_iteration()
                assert worker.iteration == worker.pull_iteration == i + 1
            worker.wait_all()
            return [t.clone() for t in local]
        return run_ps(workers, 2, params, config, [0, 1, 1], work, worker_class=LayerwisePSWorker,
                      lr=0.5, momentum=0.9)

    for ahead, end in zip(train(True), train(False)):
        for got, want in zip(ahead, end):
            assert torch.equal(got, want)
