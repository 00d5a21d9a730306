"""ficco.kernels.gluon_gemm on a Hopper GPU: every configuration of the bf16 and FP8 spaces
against an fp32 (FP8: float64, from the dequantized bits) product, on shapes whose last tiles
are ragged in M, N and K and whose programs take several tiles (the ring's phases wrap and
both ping-pong consumers take turns)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="needs a Hopper GPU (sm_90: wgmma, TMA, setmaxnreg)",
)

LIMIT = 1e-2  # one bf16 rounding of the output plus accumulation order


def _rel(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _configs(fp8):
    from ficco.kernels import gluon_gemm as gg

    return gg.FP8_CONFIGS if fp8 else gg.BF16_CONFIGS


# (M, N, K, programs): ragged tiles (N and K multiples of 16, as _scaled_mm takes them); few
# programs, so each runs several tiles and the K loop wraps the ring many times
# ... and decode rows (the swap-AB tiles' case: a's rows past M, one or two row blocks)
SHAPES = [
    (1000, 1056, 1040, None),
    (520, 784, 4096, 3),
    (129, 144, 64, 1),
    (5, 1056, 1040, None),
    (24, 784, 4096, 3),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])) + f"_p{s[3]}")
@pytest.mark.parametrize("cfg", _configs(False), ids=lambda c: c.name)
def test_bf16_config_matches_fp32(cfg, shape):
    from ficco.kernels.gluon_gemm import ws_gemm

    m, n, k, programs = shape
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn((m, k), device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn((k, n), device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ws_gemm(a, b, out, cfg, programs=programs)
    assert _rel(out, a.float() @ b.float()) <= LIMIT


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])) + f"_p{s[3]}")
@pytest.mark.parametrize("cfg", _configs(True), ids=lambda c: c.name)
def test_fp8_config_matches_the_dequantized_product(cfg, shape):
    from ficco.kernels.gluon_gemm import ws_gemm
    from ficco.kernels.scaled import random_operands

    m, n, k, programs = shape
    a, b, sa, sb, _ = random_operands(m, n, k, torch.float8_e4m3fn, "cuda", seed=m + n + k)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ws_gemm(a, b, out, cfg, a_scale=sa, b_scale=sb, programs=programs)
    assert _rel(out, ref) <= LIMIT
    # the same bits through cuBLASLt land as close
    lib = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    assert _rel(out, lib.float()) <= LIMIT


# (M, N, K, programs) where every split-tail tile of the FP8 space splits at 132 SMs: a
# program's whole tiles then one K range (3 programs), tiles fewer than programs, 4096x4096
# (thirds: 704 tiles, 44 split 3 ways), 1024x3072 (thirds 8 ways, halves 2)
SPLIT_SHAPES = [(24, 784, 4096, 3), (5, 1056, 1040, None), (4096, 4096, 2048, None),
                (1024, 3072, 4096, None)]  # fmt: skip


@pytest.mark.parametrize("cfg", [c for c in _configs(True) if c.split_tail], ids=lambda c: c.name)
def test_a_split_tail_sums_its_k_ranges_in_order_and_leaves_its_counters_zero(cfg):
    from dataclasses import replace

    from ficco.kernels.gluon_gemm import tail_plan, ws_gemm
    from ficco.kernels.persistent import _lock_buffer, default_sm_budget
    from ficco.kernels.scaled import random_operands

    split = 0
    for m, n, k, programs in SPLIT_SHAPES:
        programs = programs or default_sm_budget("cuda")
        plan = tail_plan(cfg, m, n, k, programs)
        if plan is None:
            continue
        split += 1
        a, b, sa, sb, _ = random_operands(m, n, k, torch.float8_e4m3fn, "cuda", seed=m + k)
        ref = (a.double() * sa.double()) @ (b.double() * sb.double())
        outs = []
        for _ in range(2):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            outs.append(ws_gemm(a, b, out, cfg, a_scale=sa, b_scale=sb, programs=programs))
        whole = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        ws_gemm(a, b, whole, replace(cfg, split_tail=False), a_scale=sa, b_scale=sb,
                programs=programs)  # fmt: skip
        torch.cuda.synchronize()
        assert _rel(outs[0], ref) <= LIMIT, (m, n, k, plan)
        # the partials summed in K order: the same bits every launch
        assert torch.equal(outs[0], outs[1]), (m, n, k, plan)
        assert _rel(outs[0], whole.double()) <= LIMIT
        counters = plan.tail_tiles * (cfg.block_m // cfg.rows_per_consumer)
        assert int(_lock_buffer(a.device, counters)[:counters].abs().sum()) == 0
    assert split >= 2, f"{cfg.name}: fewer than two of SPLIT_SHAPES split"


def _smallest_pick(dtype_name: str):
    """This card's smallest shipped Gluon pick of a dtype (the tuning cache's name) at the
    full-GPU budget: (m, n, k, budget, its configuration), or the test skips."""
    import re

    import triton

    from ficco.kernels.gluon_configs import shipped_picks
    from ficco.kernels.persistent import default_sm_budget
    from ficco.kernels.tuning import device_name

    prefix = f"{device_name('cuda')}|triton={triton.__version__}|{dtype_name}|"
    budget = default_sm_budget("cuda")
    shapes = [
        tuple(int(x) for x in re.search(r"m=(\d+),n=(\d+),k=(\d+)", key).groups())
        for key in shipped_picks()
        if key.startswith(prefix) and key.endswith(f"|sm={budget}")
    ]
    if not shapes:
        pytest.skip(f"no shipped Gluon pick for {prefix}sm={budget}")
    m, n, k = min(shapes, key=lambda s: s[0] * s[1] * s[2])
    return m, n, k, budget, shipped_picks()[f"{prefix}m={m},n={n},k={k}|sm={budget}"]


def test_matmul_takes_the_shipped_gluon_pick_and_matches_triton(monkeypatch, tmp_path):
    """On the card and Triton the picks were measured with, matmul runs the Gluon kernel for a
    picked shape (and the Triton kernel with FICCO_GEMM_GLUON=0, or where the user's tuning
    cache holds the shape): both match fp32."""
    from ficco.kernels.matmul import gluon_config, matmul

    m, n, k, budget, pick = _smallest_pick("bfloat16")
    monkeypatch.setenv("FICCO_CACHE_DIR", str(tmp_path))  # no user tuning of this shape
    gen = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn((m, k), device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn((k, n), device="cuda", generator=gen).to(torch.bfloat16)
    ref = a.float() @ b.float()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert gluon_config(a, b, out, budget) == pick
    assert _rel(matmul(a, b, out), ref) <= LIMIT
    monkeypatch.setenv("FICCO_GEMM_GLUON", "0")
    assert gluon_config(a, b, out, budget) is None
    out.fill_(float("nan"))
    assert _rel(matmul(a, b, out), ref) <= LIMIT
    # a strided view TMA cannot describe stays on the Triton kernel
    monkeypatch.setenv("FICCO_GEMM_GLUON", "1")
    assert gluon_config(a, b.t().contiguous().t(), out, budget) is None
    # and so does a shape the user tuned: their configuration first
    from ficco.kernels import tuning

    key = tuning.TuningKey.for_problem(m, n, k, torch.bfloat16, budget, a.device)
    cfg = tuning.config_for(m, n, k, torch.bfloat16, budget, a.device)
    tuning.store(key, {"config": cfg.to_dict()})
    assert gluon_config(a, b, out, budget) is None


def test_scaled_matmul_takes_the_shipped_fp8_pick_and_matches_the_dequantized_product(
    monkeypatch, tmp_path
):
    """FP8 as bf16 above: scaled_matmul runs the Gluon kernel for a picked fp8 shape with
    per-row and per-column scales, and its Triton kernel with FICCO_GEMM_GLUON=0 or
    per-tensor scales; all match the float64 product of the same bits."""
    from ficco.kernels import scaled
    from ficco.kernels.matmul import scaled_gluon_config

    m, n, k, budget, pick = _smallest_pick("float8_e4m3fn")
    monkeypatch.setenv("FICCO_CACHE_DIR", str(tmp_path))  # no user tuning of this shape
    a, b, sa, sb, _ = scaled.random_operands(m, n, k, torch.float8_e4m3fn, "cuda", seed=3)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    ops = scaled.prepare_operands(a, b, sa, sb, torch.bfloat16, None)
    assert scaled_gluon_config(ops, budget) == pick
    assert _rel(scaled.scaled_matmul(a, b, sa, sb), ref) <= LIMIT
    one_a, one_b = sa.max().reshape(1), sb.max().reshape(1)
    per_tensor = scaled.prepare_operands(a, b, one_a, one_b, torch.bfloat16, None)
    assert scaled_gluon_config(per_tensor, budget) is None
    monkeypatch.setenv("FICCO_GEMM_GLUON", "0")
    assert scaled_gluon_config(ops, budget) is None
    assert _rel(scaled.scaled_matmul(a, b, sa, sb), ref) <= LIMIT
