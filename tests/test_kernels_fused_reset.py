"""The fused GEMM's ``reset_waits``: the launch's last program zeroes its chunks' wait flags
(consumed), so the next launch waits for new arrivals with no memset; the default leaves
them set. Under the CPU interpreter (the conftest sets TRITON_INTERPRET where there is no GPU)."""

import pytest
import torch


@pytest.mark.parametrize("reset_waits", [False, True])
def test_reset_waits_zeroes_consumed_flags_only_when_asked(reset_waits):
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(40, 16, generator=gen), torch.randn(16, 24, generator=gen)
    out = torch.full((40, 24), float("nan"))
    flags = torch.zeros(3, dtype=torch.int32)
    chunks = [
        FusedChunkViews(a[:16], out[:16], signal=flags[0:1]),
        FusedChunkViews(a[16:], out[16:], wait=flags[1:2], name="peer"),
    ]
    kernel = FusedGemm(chunks, b, sm_budget=3, timeout_s=5.0, reset_waits=reset_waits)
    for _ in range(2):  # the second launch: its arrival set again, as a writer would
        flags[1] = 1
        out.fill_(float("nan"))
        kernel()
        assert (out - a @ b).abs().max().item() < 1e-4
        kernel.raise_on_timeout("launch")
        # the waited flag: consumed only with reset_waits; a signalled one is left set
        assert flags[1].item() == (0 if reset_waits else 1)
        assert flags[0].item() == 1 and kernel.work.eq(0).all()
        flags[0] = 0
