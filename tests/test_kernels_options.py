"""GemmConfig options the bf16 kernels no longer take: stream-K (a retired field that old
tuning caches still hold), warp specialization (the FP8 kernel's; the bf16 launch refuses
it), and the split of a last wave more than half full (left whole). Under the CPU
interpreter where there is no GPU."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from ficco.kernels import GemmConfig, candidate_configs, configs  # noqa: E402
from ficco.kernels.configs import split_plan  # noqa: E402
from ficco.kernels.persistent import INTERPRETER, launch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not INTERPRETER:
    raise RuntimeError("ficco.kernels was imported before TRITON_INTERPRET=1 was set")
PLAIN = GemmConfig(16, 16, 16, 4, 1, 4) if DEVICE == "cpu" else GemmConfig(64, 64, 32, 8, 3, 4)


def _rand(*shape, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(99)


@pytest.mark.parametrize(
    "tiles, programs, k_steps",
    [
        (96, 132, 64),  # 1024x3072 in 128x256 tiles at K = 4096: 96 of 132 programs
        (80, 132, 128),  # 512x5120 at K = 8192: split 3 ways it ran 1.08x the whole wave
        (200, 132, 256),  # a full wave, then 68 tiles
    ],
)
def test_a_last_wave_more_than_half_full_is_left_whole(tiles, programs, k_steps):
    assert split_plan(tiles, programs, k_steps) is None
    tail = tiles % programs if tiles >= programs else tiles
    fewer = tiles - tail + programs // 2  # the same full waves, a tail of half the programs
    assert split_plan(fewer, programs, k_steps) is not None


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
        launch(a, b, out, accumulate=False, sm_budget=2,
               config=replace(PLAIN, warp_specialize=True), path="tma")  # fmt: skip
    assert not any(c.warp_specialize for c in candidate_configs(8192, 8192, 8192, 2, 2))
    assert not any(
        c.warp_specialize for c in configs.fused_candidate_configs(1024, 8192, 8192, 2, 2)
    )
