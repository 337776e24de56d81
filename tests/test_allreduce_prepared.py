"""Repeated allreduces of the same tensors reuse their preparation (geryon.transport.prepared), stay
bit-exact, notice tensors changed in place, and keep no memory the caller let go of. Ranks are
threads over loopback sockets."""

import gc
import threading
import weakref

import torch

import geryon.transport.allreduce as allreduce_module
from geryon.transport.allreduce import reference_allreduce_tensors
from geryon.transport.config import TransportConfig
from transport_support import serve_world_of_threads

WORLD = 3
CONFIG = TransportConfig(secret="t", slice_bytes=1024, bucket_bytes=4096, timeout=20)


def _count_plans(monkeypatch) -> list[int]:
    """Count the bucket plans hashed (once per call that is not prepared) in every rank."""
    count, lock, digest = [0], threading.Lock(), allreduce_module.plan_digest

    def counted(*args):
        with lock:
            count[0] += 1
        return digest(*args)

    monkeypatch.setattr(allreduce_module, "plan_digest", counted)
    return count


def _inputs(iteration: int, shapes) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(iteration)
    return [[torch.randn(shape, generator=generator) for shape in shapes] for _ in range(WORLD)]


def test_the_same_tensors_again_are_prepared_once_and_stay_exact(monkeypatch):
    shapes = [(2003,), (40, 60), (1500,)]       # each fills a bucket of its own, one of them 2-D
    calls = [([0, 1, 1], "sum"), ([0, 1, 1], "avg"), ([1, 0, 0], "sum"), ([0, 1, 1], "sum")] * 2
    every_input = [_inputs(i, shapes) for i in range(len(calls))]
    plans = _count_plans(monkeypatch)

    def body(group):
        tensors = [torch.empty(shape) for shape in shapes]      # the same objects at every call
        results = []
        for inputs, (priorities, op) in zip(every_input, calls):
            for tensor, value in zip(tensors, inputs[group.rank]):
                tensor.copy_(value)
            out = group.allreduce(tensors, tuple(priorities), op=op)
            assert all(o is t for o, t in zip(out, tensors))
            results.append([t.clone() for t in tensors])
        return results, len(group._prepared)

    results = serve_world_of_threads(WORLD, CONFIG, body)
    assert plans[0] == WORLD * 3            # three distinct (priorities, op); the rest were prepared
    for rank_results, kept in results:
        assert kept == 3                    # one list of tensor objects, three (priorities, op)
        for got, inputs, (priorities, op) in zip(rank_results, every_input, calls):
            want = reference_allreduce_tensors(inputs, priorities, op, CONFIG.bucket_bytes)
            assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_a_tensor_changed_in_place_is_prepared_again(monkeypatch):
    plans = _count_plans(monkeypatch)
    first, second = _inputs(1, [(3000,)]), _inputs(2, [(5000,)])

    def body(group):
        tensor = first[group.rank][0].clone()
        group.allreduce([tensor])
        before = tensor.clone()
        tensor.data = second[group.rank][0].clone()    # the same object: other memory and shape
        group.allreduce([tensor])
        return before, tensor

    results = serve_world_of_threads(WORLD, CONFIG, body)
    assert plans[0] == 2 * WORLD
    for before, after in results:
        assert torch.equal(before, reference_allreduce_tensors(first)[0])
        assert torch.equal(after, reference_allreduce_tensors(second)[0])


def test_the_cache_keeps_no_memory_the_caller_let_go_of():
    inputs = _inputs(3, [(4000,)])

    def body(group):
        kept = torch.zeros(4000)
        group.allreduce([kept])
        tensor = inputs[group.rank][0].clone()
        group.allreduce([tensor])
        storage = tensor.untyped_storage()
        gone = weakref.ref(tensor)
        prepared_with_it = len(group._prepared)
        del tensor
        gc.collect()
        group.allreduce([kept])       # the flows' threads let go of the last collective's pieces
        # the cache held neither the tensor nor, once it went, its memory: the storage is ours alone
        return prepared_with_it, gone() is None, len(group._prepared), holders(storage)

    for prepared_with_it, tensor_went, prepared_after, storage_refs in serve_world_of_threads(WORLD, CONFIG, body):
        assert (prepared_with_it, tensor_went, prepared_after) == (2, True, 1)
        assert storage_refs == 1


def holders(storage) -> int:
    """How many tensors and storage handles share `storage`'s memory (1: only this handle)."""
    return torch._C._storage_Use_Count(storage._cdata)
