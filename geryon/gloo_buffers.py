"""Tensors handed to gloo collectives, anchored so that gloo's threads never need the GIL for them.

Why: in the PyTorch geryon pins (2.13), a tensor's C++ use count going from 2 to 1 releases the
reference its C++ side holds on its Python object, and that takes the GIL (measured:
`sys.getrefcount(t)` rises when a first view of `t` is made and falls when the last one dies).
gloo runs each collective on a worker thread of the process group, and the work object holding the
tensor is freed by whichever thread lets go of it last. `dist.all_reduce(t)` returns when the
collective's future completes; if the worker thread is preempted before it drops its reference (a
loaded machine), it is the one that frees the work, and takes the GIL, later. When that is
during interpreter finalization (a rank that exits right after its last collective), the thread is
torn down inside a destructor and the process dies with "terminate called without an active
exception" (SIGABRT) after training has ended well. pytorch/pytorch#179291 describes the same
teardown; destroying the process group at exit does not help while DDP still holds the group.

geryon's own collectives therefore never hand gloo a temporary: they reuse flat buffers that their
owner keeps (the module for `geryon.average`, the sync objects for gradients and buffers), and each
buffer is anchored by a view of itself (a view holds a C++ reference to its base). Its use count
stays at 2 or more for as long as the owner lives, so no gloo thread ever makes the 2 to 1 step.
"""


class KeptBuffers:
    """Flat 1-D buffers by name, reused while size and dtype stay the same, anchored until the owner dies."""

    def __init__(self):
        self._buffers: dict = {}
        self._anchors: dict = {}

    def get(self, name, numel: int, dtype):
        """A flat buffer of `numel` elements of `dtype` (contents undefined)."""
        import torch

        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() != numel or buffer.dtype != dtype:
            buffer = self._buffers[name] = torch.empty(numel, dtype=dtype)
            self._anchors[name] = buffer.view(-1)
        return buffer

    def flat(self, name, tensors):
        """`tensors` copied into one kept buffer, in order (torch.cat's dtype promotion). The buffer is
        in host memory whatever the tensors' device (a GPU model's buffers are gathered there first)."""
        import functools

        import torch

        dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
        buffer = self.get(name, sum(t.numel() for t in tensors), dtype)
        pieces = [t.detach().reshape(-1) for t in tensors]
        if all(t.device.type == "cpu" for t in pieces):
            torch.cat(pieces, out=buffer)
        else:
            buffer.copy_(torch.cat([t.to(dtype) for t in pieces]))
        return buffer


def broadcast_in_place(tensors, kept: KeptBuffers, src: int = 0) -> None:
    """Give every rank `src`'s values of `tensors`: one broadcast per dtype through a kept buffer,
    copied back in place (no autograd record)."""
    import torch
    import torch.distributed as dist

    by_dtype: dict = {}
    for tensor in tensors:
        if tensor.numel():
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
    with torch.no_grad():
        for dtype, group in by_dtype.items():
            flat = kept.flat(("broadcast", dtype), group)
            dist.broadcast(flat, src=src)
            copy_back(flat, group)


def copy_back(flat, tensors) -> None:
    """Copy consecutive pieces of `flat` into `tensors`, in order (the inverse of `KeptBuffers.flat`)."""
    offset = 0
    for tensor in tensors:
        tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()
