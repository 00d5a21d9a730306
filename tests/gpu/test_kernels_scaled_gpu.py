"""ficco.kernels.scaled and the fused kernel with FP8 operands on a Hopper GPU: every config
of the FP8 space, both fp8 formats, every scale pair, against the fp32 product of the
dequantized inputs and beside torch._scaled_mm (cuBLASLt) on the same operands."""

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="needs a GPU of compute capability 9.0+ (TMA)",
)

# one bf16 rounding of the output plus accumulation order: relative Frobenius error
LIMIT = 1e-2
PAIRS = [("row", "col"), ("row", "tensor"), ("tensor", "col"), ("tensor", "tensor")]


def _rel(out, ref):
    return float((out.float() - ref).norm() / ref.norm())


def _operands(m, n, k, dtype, pair):
    from ficco.kernels.scaled import random_operands

    a, b, sa, sb, _ = random_operands(m, n, k, dtype, "cuda", seed=m + n + k)
    if pair[0] == "tensor":
        sa = sa.amax().reshape(1, 1)
    if pair[1] == "tensor":
        sb = sb.amax().reshape(1, 1)
    ref = (a.float() * sa) @ (b.float() * sb)
    return a, b, sa, sb, ref


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: "/".join(p))
def test_every_fp8_config_matches_the_reference_and_scaled_mm(dtype, pair):
    from ficco.kernels.scaled import scaled_matmul
    from ficco.kernels.scaled_configs import FP8_GPU_CONFIGS

    a, b, sa, sb, ref = _operands(1000, 1040, 1024, dtype, pair)  # ragged M and N tiles
    from ficco.kernels.scaled_mm import scaled_matmul as cublas_matmul

    cublas = 0.0  # cuBLASLt has no e5m2 x e5m2 GEMM (ficco's Triton kernel has)
    if dtype == torch.float8_e4m3fn:
        cublas = _rel(cublas_matmul(a, b, sa, sb), ref)  # torch._scaled_mm
        assert cublas <= LIMIT
    # every config at e4m3 with per-row/column scales (the benchmark's compiles serve it);
    # one config per other case: each scale granularity and dtype is its own compile
    every = dtype == torch.float8_e4m3fn and pair == ("row", "col")
    for cfg in FP8_GPU_CONFIGS if every else FP8_GPU_CONFIGS[:1]:
        out = torch.full((1000, 1040), float("nan"), device="cuda", dtype=torch.bfloat16)
        scaled_matmul(a, b, sa, sb, out=out, config=cfg)
        assert _rel(out, ref) <= max(LIMIT, 2 * cublas), cfg.name


def test_sm_budget_and_a_row_slice_output():
    from ficco.kernels.scaled import scaled_matmul

    a, b, sa, sb, ref = _operands(512, 768, 512, torch.float8_e4m3fn, ("row", "col"))
    big = torch.full((600, 768), 3.0, device="cuda", dtype=torch.bfloat16)
    for budget in (1, 7, 132):
        for b_view in (b, b.contiguous()):  # column-major (K-major) and row-major B
            big[32:544].fill_(float("nan"))
            scaled_matmul(a, b_view, sa, sb, out=big[32:544], sm_budget=budget)
            assert _rel(big[32:544], ref) <= LIMIT
    assert (big[:32] == 3.0).all() and (big[544:] == 3.0).all()


@pytest.mark.parametrize("pair", [("row", "col"), ("tensor", "tensor")], ids=lambda p: "/".join(p))
def test_fused_fp8_chunks_with_preset_flags(pair):
    from ficco.kernels.fused import FusedChunkViews, FusedGemm

    a, b, sa, sb, ref = _operands(768, 1024, 1024, torch.float8_e4m3fn, pair)
    out = torch.full((768, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
    flags = torch.ones(3, dtype=torch.int32, device="cuda")
    views = [
        FusedChunkViews(
            a[lo : lo + 256], out[lo : lo + 256], wait=flags[i : i + 1],
            a_scale=sa[lo : lo + 256] if sa.numel() > 1 else sa,
        )
        for i, lo in enumerate((0, 256, 512))
    ]  # fmt: skip
    FusedGemm(views, b, sm_budget=132, timeout_s=10.0, b_scale=sb)()
    torch.cuda.synchronize()
    assert _rel(out, ref) <= LIMIT


def test_refusal_names_the_view_tma_cannot_take():
    from ficco.kernels.scaled import scaled_matmul
    from ficco.verdict import Unavailable

    a, b, sa, sb, _ = _operands(64, 64, 48, torch.float8_e4m3fn, ("row", "col"))
    storage = torch.empty(64 * 48 + 8, dtype=torch.uint8, device="cuda")
    shifted = storage[8:].view(torch.float8_e4m3fn).view(64, 48)
    with pytest.raises(Unavailable, match="16-byte aligned"):
        scaled_matmul(shifted, b, sa, sb)


def test_lagged_promotion_on_an_odd_count_of_k_steps():
    """K steps in pairs: with an odd count (K = 576: 9 steps of 64, 5 of 128, the last one
    partial) the last pair's second lies past K (zeros loaded)."""
    from ficco.kernels.scaled import scaled_matmul
    from ficco.kernels.scaled_configs import FP8_GPU_CONFIGS

    a, b, sa, sb, ref = _operands(1000, 1040, 576, torch.float8_e4m3fn, ("row", "col"))
    lagged = [c for c in FP8_GPU_CONFIGS if c.lagged_promotion]
    assert lagged
    for cfg in lagged:
        # column-major B for each (the benchmark compiled them); row-major B for one
        for b_view in (b, b.contiguous()) if cfg is lagged[0] else (b,):
            out = torch.full((1000, 1040), float("nan"), device="cuda", dtype=torch.bfloat16)
            scaled_matmul(a, b_view, sa, sb, out=out, config=cfg)
            assert _rel(out, ref) <= LIMIT, cfg.name


#: Row counts tried on cuBLASLt's row-wise FP8 GEMM, unpadded (``torch._scaled_mm`` itself)
PROBE_ROWS = (*range(1, 21), 24, 28, 32, 40, 48, 64)


def test_cublaslt_row_wise_takes_any_rows_at_aligned_scales_and_no_scales_off_them():
    """Which row counts and scale offsets cuBLASLt's row-wise FP8 GEMM takes, called
    directly: every count must run (and compute the product) with its scales at a
    ``SCALE_ALIGN``-aligned address, the rule ``aligned_scales`` keeps; some count must be
    refused with them 4 bytes past one (else the copy it makes is not needed). The table goes
    to $STAGE_DIR/cublaslt_rowwise_rows.json."""
    import json
    import os

    from ficco.kernels import scaled_mm

    a_all, b, sa_all, sb, _ = _operands(80, 64, 128, torch.float8_e4m3fn, ("row", "col"))
    ran: dict[str, dict[int, str]] = {"aligned": {}, "scale_offset_4": {}}
    for rows in PROBE_ROWS:
        for where, start in (("aligned", 0), ("scale_offset_4", 1)):
            a = a_all[start : start + rows]  # A aligned (rows of 128 bytes); scales offset
            sa = sa_all[start : start + rows]
            try:
                out = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
                torch.cuda.synchronize()
            except RuntimeError as exc:
                ran[where][rows] = f"refused: {str(exc)[:160]}"
                continue
            ref = (a.float() * sa) @ (b.float() * sb)
            ran[where][rows] = "ran" if _rel(out, ref) <= LIMIT else "wrong"
    stage = os.environ.get("STAGE_DIR")
    if stage:
        table = {
            "scale_align": scaled_mm.SCALE_ALIGN,
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            **{k: {str(r): v for r, v in got.items()} for k, got in ran.items()},
        }
        with open(os.path.join(stage, "cublaslt_rowwise_rows.json"), "w") as f:
            json.dump(table, f, indent=1)
    print({k: sorted(r for r, v in got.items() if v == "ran") for k, got in ran.items()})
    assert all(v == "ran" for v in ran["aligned"].values()), ran["aligned"]
    assert any(v.startswith("refused") for v in ran["scale_offset_4"].values()), ran
    assert "wrong" not in ran["scale_offset_4"].values(), ran["scale_offset_4"]
    # and through scaled_matmul, at every offset: the copy makes each run
    for start in range(4):
        got = scaled_mm.scaled_matmul(a_all[start : start + 6], b, sa_all[start : start + 6], sb)
        ref = (a_all[start : start + 6].float() * sa_all[start : start + 6]) @ (b.float() * sb)
        assert _rel(got, ref) <= LIMIT
