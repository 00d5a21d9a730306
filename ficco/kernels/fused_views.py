"""The chunk views of a fused launch (``ficco.kernels.fused``) and how they are addressed:
what every chunk must share, the alignment of their offsets, and where one host-built
descriptor can span them all (``row_blocks``), or else the scratch that descriptors made
inside the kernel need (``_ensure_allocator``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton

from ficco.kernels.persistent import INTERPRETER


@dataclass(frozen=True, slots=True)
class FusedCopyViews:
    """A further destination of a chunk's tiles (the same tile, stored again)."""

    out: torch.Tensor  # [rows, N], on this rank or a peer-mapped view
    signal: torch.Tensor | None = None  # 1-element int32 view of a flag, or None


@dataclass(frozen=True, slots=True)
class FusedChunkViews:
    """One chunk of a fused launch: ``out = a @ b`` over ``a``'s rows."""

    a: torch.Tensor  # [rows, K]
    out: torch.Tensor  # [rows, N], on this rank or a peer-mapped view
    wait: torch.Tensor | None = None  # 1-element int32 view of a flag, or None (ready)
    signal: torch.Tensor | None = None  # 1-element int32 view of a flag, or None
    name: str = ""
    """How errors name the chunk (e.g. 'rank 1 chunk 0')."""
    copies: tuple[FusedCopyViews, ...] = ()
    """Further destinations: each tile is computed once and stored to ``out`` and to every
    copy's ``out``; the chunk's last tile sets every destination's ``signal``."""
    a_scale: torch.Tensor | None = None
    """fp8 ``a``: its fp32 scales, one (``[1, 1]``) or per row (``[rows, 1]``)."""

    @property
    def outs(self) -> list[torch.Tensor]:
        return [self.out, *(c.out for c in self.copies)]

    @property
    def signals(self) -> list[torch.Tensor]:
        return [f for f in (self.signal, *(c.signal for c in self.copies)) if f is not None]


def _same(name: str, views: Sequence[torch.Tensor], attr: str) -> None:
    values = {v.stride() if attr == "stride" else getattr(v, attr) for v in views}
    if len(values) > 1:
        raise ValueError(f"fused GEMM: every chunk's {name} must share one {attr}, got {values}")


def _alignment(offsets: Sequence[int], element_size: int) -> int:
    """The largest power of two, up to 16 bytes' worth of elements, dividing every offset."""
    align = max(1, 16 // element_size)
    while align > 1 and any(off % align for off in offsets):
        align //= 2
    return align


def row_blocks(
    views: Sequence[torch.Tensor], block_m: int
) -> tuple[torch.Tensor, list[int]] | None:
    """One view spanning the rows of every chunk view, and each chunk's first row block of
    ``block_m`` rows in it, where a host-built descriptor of that span addresses every
    chunk's tiles exactly (no tile of one chunk reads or writes another's rows): every view
    in one storage with the same strides and first column, starting on a row-block boundary
    of the span and ending on one or at the span's end (where the descriptor clips). None
    where not: the kernel then makes a descriptor per chunk, bounded by its rows."""
    first = views[0]
    if any(
        v.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
        or v.stride() != first.stride()
        for v in views
    ):
        return None
    low = min(views, key=lambda v: v.data_ptr())
    pitch = low.stride(0) * low.element_size()
    starts = []
    for v in views:
        delta = v.data_ptr() - low.data_ptr()
        if delta % pitch:  # another first column
            return None
        starts.append(delta // pitch)
    total = max(s + v.shape[0] for s, v in zip(starts, views, strict=True))
    for s, v in zip(starts, views, strict=True):
        end = s + v.shape[0]
        if s % block_m or (end % block_m and end != total):
            return None
    span = low.as_strided((total, low.shape[1]), low.stride())
    return span, [s // block_m for s in starts]


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    # global scratch for descriptors made inside a kernel (128 bytes each per program)
    return torch.empty(size, dtype=torch.int8, device="cpu" if INTERPRETER else "cuda")


def _ensure_allocator() -> None:
    """Kernels that make tensor descriptors need Triton's scratch allocator; set ficco's
    (torch's caching allocator) where none is set in this thread's context."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)
