"""The segment-copy kernel (one launch over a list of segments), under Triton's CPU
interpreter where there is no GPU: every byte lands, nothing outside the segments is touched,
bad segments are refused by index and rule."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from ficco.kernels.segment_copy import BLOCK_WORDS, SegmentCopy, segment_copy  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _random(nbytes: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), dtype=torch.int32, generator=gen).to(
        DEVICE
    )


@pytest.mark.parametrize("parts", [None, 1, 3])
def test_every_segment_is_copied_and_nothing_else_is_written(parts):
    gen = torch.Generator().manual_seed(parts or 0)
    # lengths: one vector, odd vector counts, a block and a bit (8 KiB = BLOCK_WORDS words)
    sizes = [16, 48, 4096, 8 * BLOCK_WORDS + 16, 3 * 8 * BLOCK_WORDS + 160]
    srcs = [_random(n, gen) for n in sizes]
    # destinations are slices of one poisoned buffer, with gaps that must stay poisoned
    gap = 64 // 4
    total = sum(n // 4 for n in sizes) + gap * (len(sizes) + 1)
    poison = torch.full((total,), -7, dtype=torch.int32, device=DEVICE)
    dsts, at = [], gap
    for n in sizes:
        dsts.append(poison[at : at + n // 4])
        at += n // 4 + gap
    SegmentCopy(list(zip(srcs, dsts, strict=True)), parts=parts)()
    for i, (src, dst) in enumerate(zip(srcs, dsts, strict=True)):
        assert torch.equal(src, dst), f"segment {i} ({sizes[i]} bytes) differs"
    written = torch.zeros(total, dtype=torch.bool)
    at = gap
    for n in sizes:
        written[at : at + n // 4] = True
        at += n // 4 + gap
    assert (poison.cpu()[~written] == -7).all(), "a byte outside the segments was written"


def test_other_dtypes_and_shapes_copy_as_bytes():
    gen = torch.Generator().manual_seed(1)
    src = torch.randn(12, 8, generator=gen).to(torch.float16).to(DEVICE)  # 192 bytes, 2-D
    dst = torch.zeros_like(src)
    segment_copy([(src, dst)])
    assert torch.equal(src, dst)


def test_bad_segments_are_refused_by_index_and_rule():
    a = torch.zeros(64, dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match=r"segments\[0\]: length must be a multiple of 16"):
        SegmentCopy([(a[:24], a[32:56])])
    with pytest.raises(ValueError, match=r"segments\[1\]: the source address must be 16-byte"):
        SegmentCopy([(a[:16], a[16:32]), (a[1:17], a[32:48])])
    with pytest.raises(ValueError, match=r"segments\[0\]: source has 16 bytes, destination 32"):
        SegmentCopy([(a[:16], a[16:48])])
    with pytest.raises(ValueError, match="needs at least one"):
        SegmentCopy([])
    m = torch.zeros(4, 8, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="must be contiguous"):
        SegmentCopy([(m[:, :4], m[:, 4:])])
