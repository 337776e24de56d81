"""Elementwise tensor ops the transport runs on its own threads, without waking torch's OpenMP team.

torch splits an elementwise op over its intra-op (OpenMP) threads once it has more than GRAIN
elements; after the op those threads spin for a while waiting for the next parallel region. A
transport thread reduces one 256 KiB slice, then waits for the network, so each slice woke the team
and paid for its spin: measured here, `add_` on 65,536 floats cost ~0.7-1.1 ms of CPU per call when
calls came 0.5 ms apart, against ~0.06 ms done in pieces of GRAIN (docs/transport-profile.md). The
ops below work in pieces of at most GRAIN elements, which torch runs inline on the calling thread.
Each piece is the same elementwise op on the same elements, so results are bit-identical to the
whole-tensor op (the exactness tests compare against plain torch).
"""

from __future__ import annotations

import torch

GRAIN = 32768   # at::internal::GRAIN_SIZE: ops on at most this many elements stay on the calling thread


def add_(target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`target += source` (both flat, same length), piece by piece."""
    total = target.numel()
    if total <= GRAIN:
        return target.add_(source)
    for start in range(0, total, GRAIN):
        target[start:start + GRAIN].add_(source[start:start + GRAIN])
    return target


def div_(target: torch.Tensor, divisor) -> torch.Tensor:
    """`target /= divisor` (flat), piece by piece."""
    total = target.numel()
    if total <= GRAIN:
        return target.div_(divisor)
    for start in range(0, total, GRAIN):
        target[start:start + GRAIN].div_(divisor)
    return target


def copy_(target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`target[:] = source` (both flat, same length), piece by piece."""
    total = target.numel()
    if total <= GRAIN:
        return target.copy_(source)
    for start in range(0, total, GRAIN):
        target[start:start + GRAIN].copy_(source[start:start + GRAIN])
    return target


def mean_(out: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor:
    """`out = ((sources[0] + sources[1]) + ...) / len(sources)` (flat), piece by piece, in that order."""
    total = out.numel()
    for start in range(0, total, GRAIN):
        piece = out[start:start + GRAIN]
        piece.copy_(sources[0][start:start + GRAIN])
        for other in sources[1:]:
            piece.add_(other[start:start + GRAIN])
        piece.div_(len(sources))
    return out
