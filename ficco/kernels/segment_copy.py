"""One kernel launch that copies a list of memory segments (a batched transport).

A copy issued as its own ``cudaMemcpyAsync`` pays a fixed cost (launch, copy-engine setup)
that dominates below a few hundred KiB; an all-to-all of small expert batches issues many
such copies. ``SegmentCopy`` copies every segment of a list in one launch: program
``(s, p)`` of the grid copies every ``parts``-th block of segment ``s``, so one launch costs
one fixed cost however many segments it carries, at the price of SMs (it is an SM copy, not
a copy-engine one).

The segment table is built once (``SegmentCopy(pairs)``, on the device) and each call is one
launch: a schedule whose buffers are fixed (symmetric-memory peer buffers, a plan's chunk
views) builds it at plan time. Segments are given as (source, destination) tensor pairs;
each must be contiguous, 16-byte aligned, and a multiple of 16 bytes long, so the kernel
moves 16-byte vectors. Addresses are kept as 16-byte offsets from the first pair's tensors
(a flat device address space: a peer's buffer mapped into this process is reached the same
way).

The all-to-all schedules' ``seg`` transport (``ficco.execute.segment``) builds one
``SegmentCopy`` per step of a plan (every peer's block of the step, pulled from or pushed to
the peers' symmetric buffers, and the local block) on the first run and launches it on the
comm stream; a CUDA graph of the schedule captures the launch.

Imports Triton at module level (as the rest of ``ficco.kernels``); under the CPU interpreter
set ``TRITON_INTERPRET=1`` before importing it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

#: Bytes moved per vector: segments must be aligned to, and a multiple of, this.
ALIGN_BYTES = 16
#: 8-byte words each program copies per loop step (8 KiB).
BLOCK_WORDS = 1024


@triton.jit
def _segment_copy_kernel(
    src_base,  # *int64: the first source; segment s starts src_off[s] * 16 bytes from it
    dst_base,  # *int64
    src_off_ptr,  # [segments] int64, in 16-byte units
    dst_off_ptr,  # [segments] int64, in 16-byte units
    len_ptr,  # [segments] int64, in 16-byte units
    BLOCK: tl.constexpr,
):
    seg = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    # everything in 16-byte units times 2 words: the compiler sees 16-byte alignment
    src = src_base + tl.load(src_off_ptr + seg) * 2
    dst = dst_base + tl.load(dst_off_ptr + seg) * 2
    words = tl.load(len_ptr + seg) * 2
    blocks = tl.cdiv(words, BLOCK)
    idx = tl.arange(0, BLOCK)
    for b in range(part, blocks, parts):
        offs = b * BLOCK + idx
        mask = offs < words
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def _check_pair(i: int, src: torch.Tensor, dst: torch.Tensor) -> int:
    """Bytes of pair ``i``; ValueError naming the pair and the rule otherwise."""
    for name, t in (("source", src), ("destination", dst)):
        if not t.is_contiguous():
            raise ValueError(f"segments[{i}]: the {name} must be contiguous")
        if t.data_ptr() % ALIGN_BYTES:
            raise ValueError(
                f"segments[{i}]: the {name} address must be {ALIGN_BYTES}-byte aligned, got "
                f"{t.data_ptr():#x}"
            )
    nbytes = src.numel() * src.element_size()
    if nbytes != dst.numel() * dst.element_size():
        raise ValueError(
            f"segments[{i}]: source has {nbytes} bytes, destination "
            f"{dst.numel() * dst.element_size()}; a copy needs the same size"
        )
    if nbytes % ALIGN_BYTES:
        raise ValueError(
            f"segments[{i}]: length must be a multiple of {ALIGN_BYTES} bytes, got {nbytes}"
        )
    if src.device != dst.device:
        raise ValueError(f"segments[{i}]: source on {src.device}, destination on {dst.device}")
    return nbytes


class SegmentCopy:
    """A prepared copy of ``pairs`` (``[(src, dst), ...]``) issued as one kernel launch.

    ``parts``: programs per segment (None: enough that segments x parts is about
    ``programs`` in all, at most one per block of the longest segment). Keep the object as
    long as a CUDA graph that captured it replays: the graph reads its device table."""

    def __init__(
        self,
        pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
        *,
        parts: int | None = None,
        programs: int = 1024,
    ) -> None:
        if not pairs:
            raise ValueError("segments: needs at least one (source, destination) pair")
        sizes = [_check_pair(i, src, dst) for i, (src, dst) in enumerate(pairs)]
        device = pairs[0][0].device
        if any(src.device != device for src, _ in pairs):
            raise ValueError(f"segments: every pair must be on {device}")
        self.pairs = list(pairs)
        self.bytes = sum(sizes)
        src0, dst0 = pairs[0][0].data_ptr(), pairs[0][1].data_ptr()
        # an even row length keeps every row 16-byte aligned, so every table compiles to one
        # Triton specialization (a kernel compiled once serves every later table)
        pad = [0] * (len(pairs) % 2)
        table = [
            [(src.data_ptr() - src0) // ALIGN_BYTES for src, _ in pairs] + pad,
            [(dst.data_ptr() - dst0) // ALIGN_BYTES for _, dst in pairs] + pad,
            [n // ALIGN_BYTES for n in sizes] + pad,
        ]
        # [3, segments (+1 to even)] int64: source offsets, destination offsets, lengths, in
        # 16-byte units (the padding column is never read: the grid has one row per segment)
        self.table = torch.tensor(table, dtype=torch.int64, device=device)
        # the first pair as 8-byte words: the base pointers the offsets count from
        self._src = pairs[0][0].reshape(-1).view(torch.uint8).view(torch.int64)
        self._dst = pairs[0][1].reshape(-1).view(torch.uint8).view(torch.int64)
        longest_blocks = -(-max(sizes) // 8 // BLOCK_WORDS)
        if programs < 1:
            raise ValueError(f"programs: must be >= 1, got {programs}")
        if parts is None:
            parts = max(1, min(longest_blocks, -(-programs // len(pairs))))
        if parts < 1:
            raise ValueError(f"parts: must be >= 1, got {parts}")
        self.grid = (len(pairs), parts)

    def __call__(self) -> None:
        """Issue the copy on the current stream."""
        _segment_copy_kernel[self.grid](
            self._src,
            self._dst,
            self.table[0],
            self.table[1],
            self.table[2],
            BLOCK=BLOCK_WORDS,
        )


def segment_copy(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each ``src`` into its ``dst`` in one launch (prepares the table each call: build
    a :class:`SegmentCopy` once where the same segments are copied again)."""
    SegmentCopy(pairs)()
