"""ficco.kernels.gluon_gemm's refusals, checked before anything reaches a GPU (the kernel
itself runs in tests/gpu/test_gluon_gemm_gpu.py)."""

import pytest
import torch

gg = pytest.importorskip("ficco.kernels.gluon_gemm")

PP = gg.GluonGemmConfig(128, 128, 64, 4, 2, 4)


def test_every_shipped_config_passes_its_own_check():
    for cfg in gg.BF16_CONFIGS:
        cfg.check(2)
    for cfg in gg.FP8_CONFIGS:
        cfg.check(1)
    names = [c.name for c in gg.BF16_CONFIGS + gg.FP8_CONFIGS]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize(
    "cfg, rule",
    [
        (gg.GluonGemmConfig(128, 256, 64, 3, 2, 4), "registers a thread"),
        (gg.GluonGemmConfig(128, 128, 64, 3, 3, 4), "consumers=3"),
        (gg.GluonGemmConfig(128, 128, 64, 3, 2, 8), "one warpgroup each"),
        (gg.GluonGemmConfig(128, 256, 64, 5, 1, 8), "bytes of shared memory"),
    ],
)
def test_config_refusals_name_the_rule(cfg, rule):
    with pytest.raises(ValueError, match=rule):
        cfg.check(2)


def _bf16(m, n, k):
    a = torch.zeros((m, k), dtype=torch.bfloat16)
    b = torch.zeros((k, n), dtype=torch.bfloat16)
    return a, b, torch.empty((m, n), dtype=torch.bfloat16)


def test_operand_refusals():
    a, b, out = _bf16(64, 64, 64)
    with pytest.raises(ValueError, match="shapes"):
        gg.ws_gemm_launcher(a, b[:32], out, PP)
    with pytest.raises(ValueError, match="16-bit b is a row-major"):
        gg.ws_gemm_launcher(a, b.t().contiguous().t(), out, PP)
    with pytest.raises(ValueError, match="out: torch.float32"):
        gg.ws_gemm_launcher(a, b, out.float(), PP)
    with pytest.raises(ValueError, match="16-bit none"):
        gg.ws_gemm_launcher(a, b, out, PP, a_scale=torch.ones(64), b_scale=torch.ones(64))
    with pytest.raises(ValueError, match="dtypes"):
        gg.ws_gemm_launcher(a.float(), b.float(), out, PP)


def test_fp8_refusals():
    fp8 = torch.float8_e4m3fn
    a = torch.zeros((64, 64), dtype=fp8)
    b_row = torch.zeros((64, 64), dtype=fp8)  # [K, N] row-major: not K-major
    b_col = torch.zeros((64, 64), dtype=fp8).t()
    out = torch.empty((64, 64), dtype=torch.bfloat16)
    cfg = gg.FP8_CONFIGS[0]
    with pytest.raises(ValueError, match="FP8 wgmma reads B K-major"):
        gg.ws_gemm_launcher(a, b_row, out, cfg, a_scale=torch.ones(64), b_scale=torch.ones(64))
    with pytest.raises(ValueError, match="take a_scale"):
        gg.ws_gemm_launcher(a, b_col, out, cfg)
    with pytest.raises(ValueError, match="stored bf16"):
        gg.ws_gemm_launcher(
            a, b_col, out.half(), cfg, a_scale=torch.ones(64), b_scale=torch.ones(64)
        )
    with pytest.raises(ValueError, match=r"fp32 a_scale \[64\]"):
        gg.ws_gemm_launcher(a, b_col, out, cfg, a_scale=torch.ones(32), b_scale=torch.ones(64))
