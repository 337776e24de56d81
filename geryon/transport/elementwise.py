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


def _pieces(total: int):
    """Slices of at most GRAIN elements covering 0..total."""
    return (slice(start, start + GRAIN) for start in range(0, total, GRAIN))


def add_(target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`target += source` (both flat, same length), piece by piece."""
    if target.numel() <= GRAIN:
        return target.add_(source)
    for piece in _pieces(target.numel()):
        target[piece].add_(source[piece])
    return target


def div_(target: torch.Tensor, divisor) -> torch.Tensor:
    """`target /= divisor` (flat), piece by piece."""
    if target.numel() <= GRAIN:
        return target.div_(divisor)
    for piece in _pieces(target.numel()):
        target[piece].div_(divisor)
    return target


def copy_(target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`target[:] = source` (both flat, same length), piece by piece."""
    if target.numel() <= GRAIN:
        return target.copy_(source)
    for piece in _pieces(target.numel()):
        target[piece].copy_(source[piece])
    return target


def mean_(out: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor:
    """`out = ((sources[0] + sources[1]) + ...) / len(sources)` (flat), piece by piece, in that order."""
    for piece in _pieces(out.numel()):
        part = out[piece]
        part.copy_(sources[0][piece])
        for other in sources[1:]:
            part.add_(other[piece])
        part.div_(len(sources))
    return out
