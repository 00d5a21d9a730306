"""The swap-AB tiles of the persistent TMA kernel (`GemmConfig.swap_ab`: out^T = b^T a^T, the
tile stored transposed) on small odd shapes, under the CPU interpreter where there is no GPU
(fp32 and fp16 only: the interpreter miscomputes bf16), and the space that offers them."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from ficco.kernels import GemmConfig, candidate_configs, matmul  # noqa: E402
from ficco.kernels import persistent as kernel_paths  # noqa: E402
from ficco.kernels.configs import (  # noqa: E402
    SWAP_MAX_ROWS,
    fused_candidate_configs,
    swap_candidate_configs,
    swap_rows,
)
from ficco.kernels.fused_configs import fused_config  # noqa: E402
from ficco.kernels.persistent import INTERPRETER, launch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not INTERPRETER:
    raise RuntimeError("ficco.kernels was imported before TRITON_INTERPRET=1 was set")
DTYPES = [torch.float32, torch.float16]


def _swap(rows: int, bn: int = 32, bk: int = 16, **kw) -> GemmConfig:
    return GemmConfig(rows, bn, bk, 8, 1 if DEVICE == "cpu" else 3, 4, swap_ab=True, **kw)


def _rand(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE, dtype)


def _assert_close(got, a, b, add=None):
    ref = a.double().cpu() @ b.double().cpu() + (0 if add is None else add.double().cpu())
    base = (a @ b).double().cpu() + (0 if add is None else add.double().cpu())
    eps = torch.finfo(got.dtype).eps
    tol = 2 * (base - ref).abs().max().item() + 2 * eps * ref.abs().max().item() + 1e-30
    err = (got.double().cpu() - ref).abs().max().item()
    assert err <= tol, f"max abs error {err:.3g} > tolerance {tol:.3g}"


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(4321)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mnk", [(1, 40, 48), (3, 88, 40), (16, 64, 80), (17, 56, 24)])
def test_swap_odd_shapes(mnk, dtype, gen):
    m, n, k = mnk
    a, b = _rand(m, k, dtype=dtype, gen=gen), _rand(k, n, dtype=dtype, gen=gen)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    before = kernel_paths.LAUNCH_COUNTS["tma"]
    matmul(a, b, out, config=_swap(16 if m <= 16 else 32))
    assert kernel_paths.LAUNCH_COUNTS["tma"] == before + 1  # the TMA kernel, not a fallback
    _assert_close(out, a, b)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("split_tail", [False, True])
def test_swap_column_slice_transposed_weight(accumulate, split_tail, gen):
    # out is a column slice of a wider buffer (written only inside it), b a transposed weight
    m, n, k = 5, 48, 160
    w = _rand(n, k, dtype=torch.float32, gen=gen)  # [N, K], used as b = w^T
    a = _rand(m, k, dtype=torch.float32, gen=gen)
    big = torch.full((m, 64), float("nan"), device=DEVICE)
    if accumulate:
        big[:, 8:56] = _rand(m, n, dtype=torch.float32, gen=gen)
    before = big[:, 8:56].clone()
    cfg = _swap(16, bn=16, split_tail=split_tail)
    runs = []
    for _ in range(2):
        big[:, 8:56] = before
        launch(a, w.t(), big[:, 8:56], accumulate=accumulate, sm_budget=8, config=cfg, path="tma")
        runs.append(big[:, 8:56].clone())
    _assert_close(big[:, 8:56], a, w.t(), add=before if accumulate else None)
    assert torch.equal(runs[0], runs[1])
    assert big[:, :8].isnan().all() and big[:, 56:].isnan().all()
    assert all(int(buf.abs().sum()) == 0 for buf in kernel_paths._locks.values())


def test_swap_subtile_and_pointer_path(gen):
    m, n, k = 20, 64, 32
    a, b = _rand(m, k, dtype=torch.float32, gen=gen), _rand(k, n, dtype=torch.float32, gen=gen)
    out = torch.full((m, n), float("nan"), device=DEVICE)
    launch(a, b, out, accumulate=False, sm_budget=4, config=_swap(32, epilogue_subtile=True),
           path="tma")  # fmt: skip
    _assert_close(out, a, b)
    out.fill_(float("nan"))
    before = kernel_paths.LAUNCH_COUNTS["ptr"]
    launch(a, b, out, accumulate=False, sm_budget=4, config=_swap(32), path="ptr")
    assert kernel_paths.LAUNCH_COUNTS["ptr"] == before + 1
    _assert_close(out, a, b)


def test_swap_config_rules():
    cfg = GemmConfig(16, 128, 128, 8, 5, 4, swap_ab=True)
    assert cfg.name == "16x128x128_g8_s5_w4_swap"
    assert GemmConfig.from_dict(cfg.to_dict()) == cfg
    # a cache entry written before the field existed reads as a plain tile
    old = {k: v for k, v in GemmConfig(64, 128, 64).to_dict().items() if k != "swap_ab"}
    assert not GemmConfig.from_dict(old).swap_ab
    with pytest.raises(ValueError, match="swap_ab"):
        GemmConfig(16, 128, 64, swap_ab=True, split_k=2)
    with pytest.raises(ValueError, match="block_m >= 32"):
        GemmConfig(16, 128, 64, swap_ab=True, epilogue_subtile=True)
    assert [swap_rows(m) for m in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]


def test_swap_candidates():
    # decode rows: offered, split over the programs whole tiles leave idle (32 tiles < 132)
    small = swap_candidate_configs(1, 4096, 2048, 2, 2)
    assert small and all(c.swap_ab and c.block_m == 16 for c in small)
    # split where the tiles leave programs idle (32 or 16 tiles of 128 or 256 columns), whole
    # where they fill most of a wave (128 tiles of 32 columns)
    assert all(c.split_tail == (4096 // c.block_n <= 66) for c in small)
    assert {c.block_n for c in small if not c.split_tail} == {32}
    assert set(small) <= set(candidate_configs(1, 4096, 2048, 2, 2))
    # whole waves (264, 528 or 132 tiles on 132 programs): whole tiles, no split
    assert not any(c.split_tail for c in swap_candidate_configs(1, 33792, 2048, 2, 2))
    assert swap_candidate_configs(SWAP_MAX_ROWS + 1, 4096, 2048, 2, 2) == []
    assert not any(c.swap_ab for c in candidate_configs(1024, 4096, 2048, 2, 2))
    # the fused kernel never gets one
    assert not any(c.swap_ab for c in fused_candidate_configs(16, 4096, 2048, 2, 2))


def test_fused_config_refuses_swap_tile(monkeypatch):
    from ficco.kernels import fused_configs

    swap = replace(swap_candidate_configs(1, 4096, 2048, 2, 2)[0])
    monkeypatch.setattr(fused_configs, "known_config", lambda key: None)
    monkeypatch.setattr(fused_configs.FusedTuningKey, "for_problem", lambda *args: None)
    monkeypatch.setattr(fused_configs, "config_for", lambda *args: swap)
    cfg = fused_config(8, 4096, 2048, 1, torch.bfloat16, 132, torch.device("cuda", 0), "tma")
    assert not cfg.swap_ab and not cfg.split_tail


def test_weight_stream_tiles_are_offered_for_decode_rows_only():
    from ficco.kernels.configs import DECODE_MAX_ROWS, WEIGHT_STREAM_CONFIGS

    for cfg in WEIGHT_STREAM_CONFIGS:
        assert cfg in candidate_configs(128, 4096, 4096, 2, 2)
        assert cfg not in candidate_configs(DECODE_MAX_ROWS * 2, 4096, 4096, 2, 2)
        assert cfg not in candidate_configs(4, 4, 4, 4, 4, interpreter=True)
        assert cfg not in fused_candidate_configs(128, 4096, 4096, 2, 2)
