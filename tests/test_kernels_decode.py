"""The split-K decode GEMM (`ficco.kernels.decode`) under the Triton CPU interpreter, its
candidate space, and its place in the tuner's choice (fp32/fp16: the interpreter miscomputes
bf16 dots; tests/gpu covers bf16)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402

import pytest  # noqa: E402

from ficco.kernels import GemmConfig, cache_path, candidate_configs, matmul, tune  # noqa: E402
from ficco.kernels import persistent as kernel_paths  # noqa: E402
from ficco.kernels import tuning as tuning_mod  # noqa: E402
from ficco.kernels.configs import (  # noqa: E402
    DECODE_MAX_ROWS,
    decode_candidate_configs,
    decode_splits,
    fused_candidate_configs,
)
from ficco.kernels.decode import decode_split  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cfg(split, bm=16, bn=32, bk=16):
    return GemmConfig(bm, bn, bk, 4, 1, 4, split_k=split)


def _rand(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE, dtype)


def _check(got, a, b, add=None):
    ref = a.double().cpu() @ b.double().cpu()
    if add is not None:
        ref = ref + add.double().cpu()
    err = float((got.double().cpu() - ref).norm() / ref.norm())
    limit = 1e-5 if got.dtype == torch.float32 else 2e-3
    assert err <= limit, f"relative error {err:.3g} > {limit}"


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(4321)


@pytest.mark.parametrize(
    ("m", "n", "k", "split", "dtype"),
    [
        (1, 40, 70, 3, torch.float32),  # one row, ragged N and K, last range shorter
        (5, 33, 64, 2, torch.float16),
        (17, 64, 48, 4, torch.float32),  # two row tiles; 3 K steps: only 3 ranges
        (3, 32, 256, 1 + 1, torch.float16),
    ],
)
def test_decode_kernel_matches_float64(m, n, k, split, dtype, gen):
    a, b = _rand(m, k, dtype=dtype, gen=gen), _rand(k, n, dtype=dtype, gen=gen)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)  # every element written
    before = kernel_paths.LAUNCH_COUNTS["decode"]
    matmul(a, b, out, sm_budget=3, config=_cfg(split))
    assert kernel_paths.LAUNCH_COUNTS["decode"] == before + 1
    _check(out, a, b)
    # the arrival counters are left zero: a second launch on the stream is right too
    out.fill_(float("nan"))
    matmul(a, b, out, sm_budget=2, config=_cfg(split))
    _check(out, a, b)


def test_decode_kernel_views_and_accumulate(gen):
    # b a transposed view of a [N, K] weight; out a column slice of a wider fp32 buffer
    a = _rand(4, 48, dtype=torch.float16, gen=gen)
    w = _rand(24, 48, dtype=torch.float16, gen=gen)
    wide = torch.randn(4, 40, generator=gen).to(DEVICE)
    before = wide.clone()
    matmul(a, w.t(), wide[:, 8:32], accumulate=True, sm_budget=4, config=_cfg(3))
    _check(wide[:, 8:32], a, w.t(), add=before[:, 8:32])
    assert torch.equal(wide[:, :8], before[:, :8]) and torch.equal(wide[:, 32:], before[:, 32:])


def test_decode_split_never_leaves_an_empty_range():
    cfg = _cfg(4, bk=16)
    assert decode_split(cfg, 16 * 10) == (4, 3)  # 10 steps: 3 + 3 + 3 + 1
    assert decode_split(cfg, 16 * 9) == (3, 3)  # 4 ranges of 3 would leave one empty
    assert decode_split(cfg, 16 * 2) == (2, 1)
    assert decode_split(cfg, 5) == (1, 1)


def test_decode_splits_fill_waves():
    # 64 tiles on 132 programs: 3 ranges fill one wave, 5 two, 9 four
    assert decode_splits(64, 112, 132) == [3, 5, 9]
    assert decode_splits(64, 8, 132) == [3, 4]  # ranges of at least 2 steps
    assert decode_splits(132, 112, 132) == []  # a full wave needs no split
    assert decode_splits(1, 10_000, 132) == [32]  # at most MAX_SPLIT_K ranges


def test_decode_candidates_only_for_few_rows_and_only_on_request():
    assert decode_candidate_configs(DECODE_MAX_ROWS + 1, 8192, 8192, 2, 2) == []
    for m in (1, 7, 64, 256):
        cands = decode_candidate_configs(m, 8192, 14336, 2, 2)
        assert cands and all(c.decode for c in cands)
        assert min(c.block_m for c in cands) == min(64, max(16, 1 << (m - 1).bit_length()))
    # 512 rows of N = 8192 fill a wave with whole tiles: nothing to split; N = 2880 does not
    assert decode_candidate_configs(512, 8192, 14336, 2, 2) == []
    assert {c.block_m for c in decode_candidate_configs(512, 2880, 2048, 2, 2)} == {64, 128}
    # the tuned space stays the persistent kernels': a cache entry names the decode kernel
    assert not any(c.decode for c in candidate_configs(1, 8192, 14336, 2, 2))
    assert not any(c.decode for c in fused_candidate_configs(1, 8192, 14336, 2, 2))


def test_config_validation_and_name():
    assert _cfg(4).name.endswith("_splitk4") and _cfg(4).decode and not _cfg(1).decode
    assert GemmConfig.from_dict(_cfg(4).to_dict()) == _cfg(4)
    old = {k: v for k, v in _cfg(1).to_dict().items() if k != "split_k"}
    assert GemmConfig.from_dict(old) == _cfg(1)  # entries cached before split_k still read
    with pytest.raises(ValueError, match="split_k must be in"):
        _cfg(0)
    with pytest.raises(ValueError, match="takes neither split_tail"):
        GemmConfig(16, 32, 16, split_tail=True, split_k=2)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FICCO_CACHE_DIR", str(tmp_path))
    tuning_mod.clear_memory()
    yield tmp_path
    tuning_mod.clear_memory()


def test_the_cache_chooses_the_decode_kernel_per_shape(cache_dir, gen):
    m, n, k = 3, 40, 96
    plain, decode = GemmConfig(16, 16, 16, 4, 1, 4), _cfg(3)
    timings = iter([2.0, 1.0])  # the decode kernel wins this shape
    best = tune(
        m, n, k, torch.float32, 4, DEVICE, configs=[plain, decode], timer=lambda f: next(timings)
    )
    assert best == decode
    entry = next(iter(json.loads(cache_path().read_text())["entries"].values()))
    assert entry["path"] == "decode" and entry["config"]["split_k"] == 3
    a, b = _rand(m, k, dtype=torch.float32, gen=gen), _rand(k, n, dtype=torch.float32, gen=gen)
    from ficco.kernels.tuning import config_for

    assert config_for(m, n, k, torch.float32, 4, torch.device(DEVICE)) == decode
    # a shape with no entry keeps the untuned choice (FICCO_GEMM_AUTOTUNE=0: the heuristic)
    os.environ["FICCO_GEMM_AUTOTUNE"] = "0"
    try:
        assert not config_for(m + 1, n, k, torch.float32, 4, torch.device(DEVICE)).decode
    finally:
        del os.environ["FICCO_GEMM_AUTOTUNE"]
    _check(matmul(a, b, sm_budget=4, config=best), a, b)
