"""Buffers handed to gloo: anchored (use count >= 2), reused, and filled like torch.cat."""

import sys

import torch

from geryon.gloo_buffers import KeptBuffers


def test_a_plain_tensor_lets_go_of_its_python_object_at_use_count_one():
    """The mechanism the anchors guard against: the 2 -> 1 step touches the Python object (needs the GIL)."""
    tensor = torch.zeros(4)
    alone = sys.getrefcount(tensor)
    view = tensor.view(-1)
    assert sys.getrefcount(tensor) == alone + 1
    del view
    assert sys.getrefcount(tensor) == alone


def test_kept_buffers_stay_anchored_and_are_reused():
    kept = KeptBuffers()
    first = kept.get("average", 1, torch.float64)
    assert first._use_count() >= 2            # no other thread can make the 2 -> 1 step
    assert kept.get("average", 1, torch.float64) is first
    bigger = kept.get("average", 3, torch.float64)
    assert bigger is not first and bigger.numel() == 3 and bigger._use_count() >= 2
    assert kept.get("average", 3, torch.float32).dtype == torch.float32


def test_flat_copies_in_order_with_torch_cat_promotion():
    kept = KeptBuffers()
    tensors = [torch.arange(4, dtype=torch.float32).view(2, 2), torch.tensor([7], dtype=torch.float64)]
    flat = kept.flat("gradients", tensors)
    assert torch.equal(flat, torch.cat([t.reshape(-1) for t in tensors]))
    assert flat.dtype == torch.float64
    tensors[0].add_(1)
    assert kept.flat("gradients", tensors) is flat
    assert flat.tolist() == [1, 2, 3, 4, 7]
