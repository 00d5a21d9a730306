"""The split tail of the persistent TMA kernel where the last wave is more than half full
(`configs.split_plan`'s wave model: several waves of K-range units), under the CPU
interpreter where there is no GPU (fp32: the interpreter miscomputes bf16); the retired
stream-K field of old tuning caches; warp specialization refused by the bf16 kernels."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from ficco.kernels import GemmConfig, candidate_configs, configs  # noqa: E402
from ficco.kernels import persistent as kernel_paths  # noqa: E402
from ficco.kernels.configs import SplitPlan, split_plan, splits_in_one_wave  # noqa: E402
from ficco.kernels.persistent import INTERPRETER, launch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not INTERPRETER:
    raise RuntimeError("ficco.kernels was imported before TRITON_INTERPRET=1 was set")
SPLIT = (
    GemmConfig(16, 16, 16, 4, 1, 4, split_tail=True)
    if DEVICE == "cpu"
    else GemmConfig(64, 64, 32, 8, 3, 4, split_tail=True)
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
        # 512x5120 in 128x256 tiles at K = 8192: 80 tiles, 3 ways: two waves of thirds
        (80, 132, 128, SplitPlan(0, 80, 3, 43)),
        # 1024x3072 at K = 4096: 96 tiles; 4 ways would be 3 waves of quarters, but their
        # partials (8 steps each of 64) make that 1.13 tiles' time: left whole
        (96, 132, 64, None),
        (120, 132, 128, None),  # 120 of 132: no split shortens it
        (2048, 132, 128, None),  # 16 waves: the last one's split gains under 5%
        (200, 132, 256, SplitPlan(132, 68, 5, 52)),  # two waves; the second: 3 waves of fifths
    ],
)
def test_wave_split_plan(tiles, programs, k_steps, expected):
    plan = split_plan(tiles, programs, k_steps)
    assert plan == expected
    if plan is not None:
        assert plan.units > plan.dp_tiles + programs // 2  # more than half a wave of units
        assert (plan.split - 1) * plan.k_per_split < k_steps <= plan.split * plan.k_per_split


@pytest.mark.parametrize("accumulate", [False, True])
def test_wave_split_matches_reference(accumulate, gen, monkeypatch):
    # 3 tiles on 4 programs (the tail is 3/4 of a wave), 16 K steps: with free partials the
    # model splits them 4 ways, 12 units in 3 waves of quarters; ragged rows and a column
    # slice of a wider output
    monkeypatch.setattr(configs, "SPLIT_PARTIAL_STEPS", 0)
    m, n, k = 40, SPLIT.block_n, 16 * SPLIT.block_k
    plan = split_plan(-(-m // SPLIT.block_m), 4, 16)
    assert plan == SplitPlan(0, 3, 4, 4) and plan.units > 4
    a, b = _rand(m, k, gen=gen), _rand(k, n, gen=gen)
    big = torch.full((m, n + 16), float("nan"), device=DEVICE)
    if accumulate:
        big[:, 8 : 8 + n] = _rand(m, n, gen=gen)
    before = big[:, 8 : 8 + n].clone()
    runs = []
    for _ in range(2):  # the arrival counters reset themselves between launches
        big[:, 8 : 8 + n] = before
        launch(a, b, big[:, 8 : 8 + n], accumulate=accumulate, sm_budget=4, config=SPLIT,
               path="tma")  # fmt: skip
        runs.append(big[:, 8 : 8 + n].clone())
    _assert_close(big[:, 8 : 8 + n], a, b, add=before if accumulate else None)
    assert torch.equal(runs[0], runs[1])  # fixed summation order: deterministic
    assert big[:, :8].isnan().all() and big[:, 8 + n :].isnan().all()
    assert all(int(buf.abs().sum()) == 0 for buf in kernel_paths._locks.values())


def test_wave_split_candidates():
    # 512x5120x8192: the 128x256 tile is offered whole and split (two waves of thirds)
    cands = candidate_configs(512, 5120, 8192, 2, 2)
    big = configs.GPU_CONFIGS[0]
    assert big in cands and replace(big, split_tail=True) in cands
    assert not splits_in_one_wave(replace(big, split_tail=True), 512, 5120, 8192, 132)
    # 1024x3072x4096: nothing split on the 128x256 tile (the model's partials cost more)
    assert replace(big, split_tail=True) not in candidate_configs(1024, 3072, 4096, 2, 2)
    # swap-AB tiles: whole beside a several-wave split, only the split for a one-wave one
    swaps = [c for c in candidate_configs(4, 12288, 14336, 2, 2) if c.swap_ab]
    names = {c.name for c in swaps}
    for c in swaps:
        if c.split_tail and splits_in_one_wave(c, 4, 12288, 14336, 132):
            assert replace(c, split_tail=False).name not in names


def test_retired_stream_k_field():
    fields = GemmConfig(128, 256, 64, 8, 4, 8, True).to_dict()
    assert "stream_k" not in fields
    # a tuning cache written before stream-K went: the field at its default is dropped ...
    assert GemmConfig.from_dict({**fields, "stream_k": False}) == GemmConfig.from_dict(fields)
    # ... and an entry that names a stream-K kernel is refused (the cache then retunes)
    with pytest.raises(ValueError, match="stream_k"):
        GemmConfig.from_dict({**fields, "stream_k": True})


def test_warp_specialize_refused_by_bf16_kernels(gen):
    cfg = GemmConfig(128, 256, 64, 8, 3, 8, warp_specialize=True)  # the FP8 kernel's option
    assert cfg.name == "128x256x64_g8_s3_w8_ws"
    with pytest.raises(ValueError, match="warp_specialize"):
        GemmConfig(128, 128, 64, split_tail=True, warp_specialize=True)
    a, b = _rand(16, 16, gen=gen), _rand(16, 16, gen=gen)
    out = torch.empty(16, 16, device=DEVICE)
    with pytest.raises(ValueError, match="warp_specialize"):
        launch(a, b, out, accumulate=False, sm_budget=2, config=replace(SPLIT, split_tail=False,
               warp_specialize=True), path="tma")  # fmt: skip
    assert not any(c.warp_specialize for c in candidate_configs(8192, 8192, 8192, 2, 2))
    assert not any(
        c.warp_specialize for c in configs.fused_candidate_configs(1024, 8192, 8192, 2, 2)
    )
