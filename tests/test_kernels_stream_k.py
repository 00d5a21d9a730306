"""Stream-K in the persistent TMA kernel (`GemmConfig.stream_k`): the last wave's K steps dealt
out in runs that cross tile edges, under the CPU interpreter where there is no GPU (fp32:
the interpreter miscomputes bf16), and its plan (`configs.stream_k_plan`); and the warp
specialization option (`GemmConfig.warp_specialize`)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from ficco.kernels import GemmConfig, candidate_configs  # noqa: E402
from ficco.kernels import persistent as kernel_paths  # noqa: E402
from ficco.kernels.configs import (  # noqa: E402
    STREAM_K_BASES,
    WARP_SPECIALIZE_BASES,
    StreamKPlan,
    fused_candidate_configs,
    split_plan,
    stream_k_plan,
)
from ficco.kernels.persistent import INTERPRETER, launch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not INTERPRETER:
    raise RuntimeError("ficco.kernels was imported before TRITON_INTERPRET=1 was set")
STREAM = (
    GemmConfig(16, 16, 16, 4, 1, 4, stream_k=True)
    if DEVICE == "cpu"
    else GemmConfig(64, 64, 32, 8, 3, 4, stream_k=True)
)


def _rand(*shape, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE)


def _assert_close(got, a, b, add=None):
    ref = a.double().cpu() @ b.double().cpu() + (0 if add is None else add.double().cpu())
    err = (got.double().cpu() - ref).abs().max().item()
    assert err <= 1e-4 * max(1.0, ref.abs().max().item()), f"max abs error {err:.3g}"


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(99)


@pytest.mark.parametrize(
    "tiles, programs, k_steps, expected",
    [
        (96, 132, 64, StreamKPlan(0, 96, 47, 132)),  # one short wave: 96 tiles, runs of 47
        (160, 132, 128, StreamKPlan(132, 28, 28, 132)),  # a full wave, then 28 tiles' steps
        (264, 132, 64, None),  # whole waves only
        (252, 132, 64, None),  # last wave 120/132 full: left whole
        (3, 132, 4, None),  # runs of 4 steps (the least) would not be shorter than a tile
        (2, 100, 100, StreamKPlan(0, 2, 4, 100)),  # few steps a program: runs of 4, 50 used
    ],
)
def test_stream_k_plan(tiles, programs, k_steps, expected):
    plan = stream_k_plan(tiles, programs, k_steps)
    assert plan == expected
    if plan is not None:
        assert plan.dp_tiles % programs == 0  # whole waves: program p's runs are its units
        assert plan.run_steps < k_steps  # a run touches at most two tiles
        assert -(-plan.sk_tiles * k_steps // plan.run_steps) <= programs  # every step dealt


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize(
    "m, n, k, sm_budget",
    [
        (40, 64, 160, 5),  # 12 tiles of 10 steps on 5 programs: 10 whole, 2 dealt in runs of 4
        (40, 64, 160, 16),  # one short wave: runs of 4 over 15 programs, the 16th idle
        (33, 48, 112, 7),  # ragged tiles; runs of 4 cross tile edges mid-tile
    ],
)
def test_stream_k_matches_reference(m, n, k, sm_budget, accumulate, gen):
    tiles = -(-m // STREAM.block_m) * -(-n // STREAM.block_n)
    assert stream_k_plan(tiles, sm_budget, -(-k // STREAM.block_k)) is not None
    a, b = _rand(m, k, gen=gen), _rand(k, n, gen=gen)
    big = torch.full((m, n + 16), float("nan"), device=DEVICE)
    if accumulate:
        big[:, 8 : 8 + n] = _rand(m, n, gen=gen)
    before = big[:, 8 : 8 + n].clone()
    runs = []
    for _ in range(2):  # the arrival counters reset themselves between launches
        big[:, 8 : 8 + n] = before
        launch(a, b, big[:, 8 : 8 + n], accumulate=accumulate, sm_budget=sm_budget,
               config=STREAM, path="tma")  # fmt: skip
        runs.append(big[:, 8 : 8 + n].clone())
    _assert_close(big[:, 8 : 8 + n], a, b, add=before if accumulate else None)
    assert torch.equal(runs[0], runs[1])  # fixed summation order: deterministic
    assert big[:, :8].isnan().all() and big[:, 8 + n :].isnan().all()
    assert all(int(buf.abs().sum()) == 0 for buf in kernel_paths._locks.values())


def test_stream_k_with_swap_ab(gen):
    m, n, k = 5, 48, 160  # swap-AB: 3 tiles of N in the kernel's rows, 10 steps, 8 programs
    a, b = _rand(m, k, gen=gen), _rand(k, n, gen=gen)
    out = torch.full((m, n), float("nan"), device=DEVICE)
    cfg = replace(STREAM, swap_ab=True)
    launch(a, b, out, accumulate=False, sm_budget=8, config=cfg, path="tma")
    _assert_close(out, a, b)


def test_stream_k_config_and_candidates():
    cfg = GemmConfig(128, 256, 64, 8, 4, 8, True, stream_k=True)
    assert cfg.name == "128x256x64_g8_s4_w8_sub_streamk"
    assert GemmConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="stream_k"):
        GemmConfig(128, 128, 64, split_tail=True, stream_k=True)
    # 1024x3072x4096: 96 tiles of 128x256 on 132 SMs; the split tail cannot split them (132 //
    # 96 = 1), stream-K would deal their 6144 K steps out in runs of 47, but it measured
    # slower on every shape of one H100: the space offers it nowhere
    assert split_plan(96, 132, 64) is None
    assert stream_k_plan(96, 132, 64) is not None
    assert STREAM_K_BASES == ()
    assert not any(c.stream_k for c in candidate_configs(1024, 3072, 4096, 2, 2))
    assert not any(c.stream_k for c in fused_candidate_configs(1024, 3072, 4096, 2, 2))


@pytest.mark.parametrize("accumulate", [False, True])
def test_warp_specialized_config_runs(accumulate, gen):
    # the interpreter runs the K loop plainly; the GPU compiles producer and consumer warps
    m, n, k = 40, 48, 80
    a, b = _rand(m, k, gen=gen), _rand(k, n, gen=gen)
    out = torch.full((m, n), float("nan"), device=DEVICE)
    before = torch.zeros_like(out) if not accumulate else _rand(m, n, gen=gen)
    out.copy_(before) if accumulate else None
    cfg = replace(STREAM, stream_k=False, warp_specialize=True)
    launch(a, b, out, accumulate=accumulate, sm_budget=3, config=cfg, path="tma")
    _assert_close(out, a, b, add=before if accumulate else None)


def test_warp_specialize_rules_and_candidates():
    cfg = GemmConfig(128, 256, 64, 8, 3, 8, warp_specialize=True)
    assert cfg.name == "128x256x64_g8_s3_w8_ws"
    assert GemmConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="warp_specialize"):
        GemmConfig(128, 128, 64, split_tail=True, warp_specialize=True)
    # measured slower on an H100: the space offers it nowhere
    assert WARP_SPECIALIZE_BASES == ()
    assert not any(c.warp_specialize for c in candidate_configs(8192, 8192, 8192, 2, 2))
    assert not any(c.warp_specialize for c in candidate_configs(64, 64, 64, 4, 4, interpreter=True))
    assert not any(c.warp_specialize for c in fused_candidate_configs(1024, 8192, 8192, 2, 2))
