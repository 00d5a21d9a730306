"""GemmConfig options the bf16 kernels no longer take: stream-K (a retired field that old
tuning caches still hold), warp specialization (the FP8 kernel's; the bf16 launch refuses
it), and the split of a last wave more than half full (left whole). Under the CPU
interpreter where there is no GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from ficco.kernels import GemmConfig, candidate_configs, configs  # noqa: E402
from ficco.kernels import persistent as kernel_paths  # noqa: E402
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


@pytest.mark.parametrize(
    "a_t, b_t, accumulate, a_regs",
    [(False, False, False, False), (True, True, True, False), (False, True, False, True)],
)
def test_three_part_tiles_match_the_reference(a_t, b_t, accumulate, a_regs, gen):
    # A 48-wide tile is three 16-column accumulators (ficco.kernels.wide); ragged M, N and K
    # (N = 100: the last tile's third part lies wholly past N) and both operand layouts.
    # (a_in_registers is an inline-asm copy on the GPU; the interpreter skips it.)
    cfg = GemmConfig(16, 48, 16, 4, 1, 4) if DEVICE == "cpu" else GemmConfig(128, 192, 64, 8, 3, 8)
    cfg = replace(cfg, a_in_registers=a_regs)
    assert cfg.n_parts == 3 and cfg.name.startswith(f"{cfg.block_m}x{cfg.block_n}x")
    m, n, k = (40, 100, 36) if DEVICE == "cpu" else (520, 1000, 300)
    a = _rand(k, m, gen=gen).t() if a_t else _rand(m, k, gen=gen)
    b = _rand(n, k, gen=gen).t() if b_t else _rand(k, n, gen=gen)
    out = _rand(m, n, gen=gen)
    expected = a.double() @ b.double() + (out.double() if accumulate else 0)
    before = kernel_paths.LAUNCH_COUNTS["wide"]
    launch(a, b, out, accumulate=accumulate, sm_budget=3, config=cfg, path="tma")
    assert kernel_paths.LAUNCH_COUNTS["wide"] == before + 1
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)


def test_three_part_widths_take_no_other_option():
    assert GemmConfig(128, 96, 64).n_parts == 3 and GemmConfig(128, 128, 64).n_parts == 1
    with pytest.raises(ValueError, match="a_in_registers is the three-part tiles' option"):
        GemmConfig(128, 128, 64, a_in_registers=True)
    for extra in (
        {"epilogue_subtile": True},
        {"split_tail": True},
        {"swap_ab": True},
        {"split_k": 2},
    ):
        with pytest.raises(ValueError, match="three-part tile"):
            GemmConfig(128, 192, 64, **extra)
    with pytest.raises(ValueError, match=r"block_n must be a power of two .* or one of"):
        GemmConfig(128, 160, 64)
    # the persistent space offers them, whole; the fused space never does
    wide = [c for c in candidate_configs(1024, 3072, 4096, 2, 2) if c.n_parts == 3]
    assert wide and not any(c.split_tail for c in wide)
    assert all(c.n_parts == 1 for c in configs.fused_candidate_configs(1024, 3072, 4096, 2, 2))


def test_three_part_tiles_on_the_pointer_path_fall_back_with_a_warning(gen):
    cfg = GemmConfig(16, 48, 16, 4, 1, 4) if DEVICE == "cpu" else GemmConfig(64, 96, 128, 8, 4, 4)
    a, b = _rand(20, 24, gen=gen), _rand(24, 50, gen=gen)
    out = torch.empty(20, 50, device=DEVICE)
    kernel_paths._warned.clear()
    with pytest.warns(RuntimeWarning, match="three-part tiles run on the TMA path only"):
        launch(a, b, out, accumulate=False, sm_budget=2, config=cfg, path="ptr")
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["128x192x64_g8_s4_w8", "128x192x64_g8_s4_w8_rs"])
def test_three_part_tile_compiles_for_sm90_without_serialized_wgmma(name):
    # Flattened, the tile loop made ptxas serialize the three dots (C7515) and the tiles ran
    # up to 2.7x slower on one H100; the sm_90 compile must carry no such note. The `_rs`
    # tile's dots must take A from registers (wgmma's register-A form).
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    got = subprocess.run(
        [sys.executable, str(root / "tests" / "compile_kernels_sm90.py"), "--wide", name],
        capture_output=True, text=True, cwd=root, env=env,
    )  # fmt: skip
    if got.returncode == 3:
        pytest.skip(f"no offline sm_90 compile in this Triton: {got.stderr.strip()}")
    assert got.returncode == 0, got.stderr[-2000:]
    found = json.loads(got.stdout.strip().splitlines()[-1])["kernels"][name]
    assert found["wgmma"] == ["wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"], found
    assert found["a_from_registers"] == name.endswith("_rs"), found
    ptxas = found["ptxas"]
    assert ptxas is None or (ptxas["notes"] == [] and ptxas["spill_bytes"] == 0), ptxas
