"""The split-K decode GEMM on a CUDA GPU in bf16 (the CPU interpreter miscomputes bf16 dots):
decode shapes, views, accumulate, and the tuner's choice between it and the persistent GEMM.

Skipped without CUDA. Bar: relative Frobenius error against an fp32 reference at most twice
torch.matmul's own in bf16, and never above 1e-2.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ficco.kernels import GemmConfig, matmul, tune  # noqa: E402
from ficco.kernels import persistent as kernel_paths  # noqa: E402
from ficco.kernels import tuning as tuning_mod  # noqa: E402
from ficco.kernels.configs import (  # noqa: E402
    candidate_configs,
    decode_candidate_configs,
    swap_candidate_configs,
)

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FICCO_CACHE_DIR", str(tmp_path))
    tuning_mod.clear_memory()
    yield
    tuning_mod.clear_memory()


def _err(out, ref):
    return float((out.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("m", [1, 5, 64, 256])
@pytest.mark.parametrize("split", [2, 7])
def test_decode_kernel_bf16(m, split):
    n, k = 4096, 7168
    gen = torch.Generator(device=DEV).manual_seed(m * 31 + split)
    a = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
    b = torch.randn(k, n, device=DEV, generator=gen).to(torch.bfloat16)
    ref = a.float() @ b.float()
    bar = min(1e-2, 2 * _err(torch.matmul(a, b), ref) + 1e-4)
    cfg = GemmConfig(16 if m < 64 else 64, 128, 128, 8, 4, 4, split_k=split)
    out = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    before = kernel_paths.LAUNCH_COUNTS["decode"]
    for _ in range(3):  # the arrival counters reset themselves between launches
        out.fill_(float("nan"))
        matmul(a, b, out, config=cfg)
        torch.cuda.synchronize()
        assert _err(out, ref) <= bar
    assert kernel_paths.LAUNCH_COUNTS["decode"] == before + 3


def test_decode_kernel_views_and_accumulate():
    m, n, k = 8, 2880, 2048
    gen = torch.Generator(device=DEV).manual_seed(5)
    a = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, device=DEV, generator=gen).to(torch.bfloat16)  # [N, K] weight
    wide = torch.randn(m, n + 64, device=DEV, generator=gen)  # fp32, written in a slice
    keep = wide.clone()
    matmul(
        a,
        w.t(),
        wide[:, 32 : 32 + n],
        accumulate=True,
        config=GemmConfig(16, 64, 256, 8, 4, 4, split_k=4),
    )
    ref = a.float() @ w.float().t() + keep[:, 32 : 32 + n]
    assert _err(wide[:, 32 : 32 + n], ref) <= 1e-2
    assert torch.equal(wide[:, :32], keep[:, :32]) and torch.equal(
        wide[:, 32 + n :], keep[:, 32 + n :]
    )


def test_tuner_offers_and_checks_decode_configs():
    m, n, k = 4, 8192, 4096
    decode = decode_candidate_configs(m, n, k, 2, 2)[:3]
    plain = candidate_configs(m, n, k, 2, 2)[:2]
    best = tune(m, n, k, torch.bfloat16, configs=decode + plain, read_cache=False)
    assert best in decode + plain
    entry = tuning_mod.cache_entry(
        tuning_mod.TuningKey.for_problem(m, n, k, torch.bfloat16, best_budget(), DEV)
    )
    assert set(entry["timings_ms"]) == {c.name for c in decode + plain}  # all correct, all timed
    assert entry["path"] == ("decode" if best.decode else "tma")


def best_budget() -> int:
    return kernel_paths.default_sm_budget(DEV)


@pytest.mark.parametrize("m", [1, 7, 16, 33, 64])
def test_swap_ab_tiles_bf16(m):
    # every swap-AB tile the space offers for these rows, on a 2880-wide layer (a ragged last
    # tile for 64/128/256 columns) and a 16384-wide one (whole waves: no split)
    for n, k in ((2880, 2048), (16384, 1024)):
        gen = torch.Generator(device=DEV).manual_seed(m * 7 + n)
        a = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
        w = torch.randn(n, k, device=DEV, generator=gen).to(torch.bfloat16)
        ref = a.float() @ w.float().t()
        bar = min(1e-2, 2 * _err(torch.matmul(a, w.t()), ref) + 1e-4)
        configs = swap_candidate_configs(m, n, k, 2, 2, sm_budget=best_budget())
        assert configs
        for cfg in configs:
            for b in (w.t(), w.t().contiguous()):  # a transposed weight and a row-major one
                out = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
                before = kernel_paths.LAUNCH_COUNTS["tma"]
                for _ in range(2):  # split tails' arrival counters reset themselves
                    matmul(a, b, out, config=cfg)
                torch.cuda.synchronize()
                assert kernel_paths.LAUNCH_COUNTS["tma"] == before + 2, cfg.name
                assert _err(out, ref) <= bar, cfg.name


def test_swap_ab_accumulate_into_fp32_slice():
    m, n, k = 5, 4096, 2048
    gen = torch.Generator(device=DEV).manual_seed(11)
    a = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
    b = torch.randn(k, n, device=DEV, generator=gen).to(torch.bfloat16)
    wide = torch.randn(m, n + 64, device=DEV, generator=gen)
    keep = wide.clone()
    cfg = swap_candidate_configs(m, n, k, 2, 2)[0]
    matmul(a, b, wide[:, 32 : 32 + n], accumulate=True, config=cfg)
    ref = a.float() @ b.float() + keep[:, 32 : 32 + n]
    assert _err(wide[:, 32 : 32 + n], ref) <= 1e-2
    assert torch.equal(wide[:, :32], keep[:, :32]) and torch.equal(
        wide[:, 32 + n :], keep[:, 32 + n :]
    )
