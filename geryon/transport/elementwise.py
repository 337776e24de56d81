"""Elementwise tensor ops the transport runs on its own threads, without waking torch's OpenMP team.

torch splits an elementwise op over its intra-op (OpenMP) threads once it has more than GRAIN
elements; after the op those threads spin for a while waiting for the next parallel region. A
transport thread reduces one 256 KiB slice, then waits for the network, so each slice woke the team
and paid for its spin: measured here, `add_` on 65,536 floats cost ~0.7-1.1 ms of CPU per call when
calls came 0.5 ms apart, against ~0.06 ms done in pieces of GRAIN (docs/transport.md). The
ops below work in pieces of at most GRAIN elements, which torch runs inline on the calling thread.
Each piece is the same elementwise op on the same elements, so results are bit-identical to the
whole-tensor op (the exactness tests compare against plain torch).

The allreduce's per-slice reduction goes through numpy instead where numpy computes the same bits
(`array_of`, `add_array_`, `div_array_`): numpy runs on the calling thread, releases the GIL, and
costs a few calls where torch's path costs about ten. That matters because a slice lands about every
20 ms at 100 Mbit/s, and a call after such a gap runs with cold caches: measured here, reducing a
256 KiB slice after a 20 ms gap took 289 µs through torch and 157 µs through numpy (docs/transport.md).
For float32 and float64, IEEE addition and division round once in either
library, and both leave NaNs as the processor makes them; integers wrap in both. float16 is added
and divided in float32 and rounded to half by both, which is exact since float32 has more than twice
half's precision; only a NaN's sign can differ, and it differs within torch too (its vectorized loop
keeps the processor's negative NaN from inf + -inf, its scalar tail makes it positive, so the sign
depends on where a slice starts). bfloat16, which numpy lacks, stays with torch.
"""

from __future__ import annotations

import numpy as np
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


NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
                torch.int32: np.int32, torch.int64: np.int64, torch.uint8: np.uint8, torch.int8: np.int8}


def array_of(flat: torch.Tensor) -> np.ndarray | None:
    """A numpy array over the memory of `flat` (one-dimensional, contiguous, on the CPU), or None
    when numpy does not compute its dtype's add and division bit-identically to torch."""
    if flat.dtype not in NUMPY_DTYPES or flat.device.type != "cpu":
        return None
    return flat.detach().numpy()


def add_array_(target: np.ndarray, source: np.ndarray) -> None:
    """`target += source` (same length and dtype) as torch's `add_` computes it; no warnings (torch
    gives none for inf - inf or overflow either)."""
    with np.errstate(all="ignore"):
        np.add(target, source, out=target)


def div_array_(target: np.ndarray, divisor: int) -> None:
    """`target /= divisor` (floating point) as torch's `div_` computes it."""
    with np.errstate(all="ignore"):
        np.divide(target, divisor, out=target)
