"""ficco.kernels.gluon_gemm's configurations and refusals, checked before anything reaches a
GPU, and the CPU side of its scripts (the picks rule, the benchmark's shape sets and summary);
the kernel itself runs in tests/gpu/test_gluon_gemm_gpu.py."""

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

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
        (gg.GluonGemmConfig(128, 224, 64, 3, 1, 8), r"power-of-two tail .*\(128 \+ 96\)"),
        (gg.GluonGemmConfig(128, 144, 64, 3, 1, 8), r"at least 32 columns \(128 \+ 16\)"),
        (gg.GluonGemmConfig(128, 320, 64, 3, 1, 4), "registers a thread"),
        (gg.GluonGemmConfig(64, 16, 64, 8, 2, 4, swap_ab=True), "a swap-AB tile is one 4-warp"),
        (gg.GluonGemmConfig(128, 16, 64, 8, 1, 4, swap_ab=True), "64 weight columns"),
        (gg.GluonGemmConfig(64, 8, 64, 8, 1, 4, swap_ab=True), "by 16, 32 or 64 rows"),
        (gg.GluonGemmConfig(64, 16, 64, 8, 1, 4, True, swap_ab=True), "its epilogue whole"),
        (gg.GluonGemmConfig(128, 128, 64, 4, 1, 8, shared_tile=True), "2 or 3 four-warp"),
        (gg.GluonGemmConfig(64, 128, 64, 4, 2, 4, shared_tile=True), r"block_m = 64 x consumers"),
        (gg.GluonGemmConfig(256, 128, 64, 3, 2, 4, shared_tile=True), r"block_m = 64 x consumers"),
        (gg.GluonGemmConfig(128, 192, 64, 3, 2, 4, shared_tile=True), "no tail"),
        (gg.GluonGemmConfig(256, 128, 64, 3, 4, 4, shared_tile=True), "consumers=4"),
        (gg.GluonGemmConfig(64, 16, 64, 8, 1, 4, swap_ab=True, split_tail=True), "a split tail"),
        (gg.GluonGemmConfig(128, 192, 32, 8, 1, 8, split_tail=True), "a split tail"),
        (gg.GluonGemmConfig(128, 128, 128, 4, 2, 4, split_tail=True), "16 rows a warp"),
    ],
)
def test_config_refusals_name_the_rule(cfg, rule):
    with pytest.raises(ValueError, match=rule):
        cfg.check(2)


def test_a_split_tail_splits_the_last_wave_only_where_it_fills_idle_programs():
    thirds = gg.GluonGemmConfig(192, 128, 128, 4, 3, 4, shared_tile=True, split_tail=True)
    assert thirds.name == "ws_192x128x128_s4_coop3x4_split"
    # 4096x4096: 22 x 32 = 704 tiles on 132 SMs, 44 past the fifth wave, each in 3 K ranges
    plan = gg.tail_plan(thirds, 4096, 4096, 7168, 132)
    assert (plan.dp_tiles, plan.tail_tiles, plan.split, plan.k_per_split) == (660, 44, 3, 19)
    assert plan.units == 660 + 44 * 3 <= 6 * 132  # one unit of the tail a program at most
    # a tail of more than half the programs stays whole; no tail, nothing to split; a
    # configuration without the flag never splits
    assert gg.tail_plan(thirds, 2048, 4096, 7168, 132) is None  # 352 tiles: 88 past two waves
    assert gg.tail_plan(thirds, 192 * 11, 128 * 12, 4096, 132) is None  # 132 tiles
    assert gg.tail_plan(replace(thirds, split_tail=False), 4096, 4096, 7168, 132) is None
    # each range keeps >= 4 K steps: 1024x3072x4096's 12 tail tiles split 8 ways, not 11
    assert gg.tail_plan(thirds, 1024, 3072, 4096, 132).split == 8
    # every split tail of the FP8 space has its unsplit twin there (the same tile)
    names = {c.name for c in gg.FP8_CONFIGS}
    for cfg in gg.FP8_CONFIGS:
        if cfg.split_tail:
            assert replace(cfg, split_tail=False).name in names


def test_a_launchs_split_tail_holds_its_workspace_counters_and_arguments():
    thirds = gg.GluonGemmConfig(192, 128, 128, 4, 3, 4, shared_tile=True, split_tail=True)
    out = torch.empty(4096, 4096, dtype=torch.bfloat16)
    split = gg.SplitTail.of(thirds, 4096, 4096, 7168, 132, out, own_counters=True)
    # 44 tail tiles, 3 K ranges each, a 192x128 fp32 partial per range; a counter per part
    assert split.workspace.numel() == 44 * 3 * 192 * 128
    assert split.workspace.dtype == torch.float32
    assert split.owned.tolist() == [0] * (44 * 3)
    assert split.units(704) == 660 + 44 * 3
    ws, locks, dp_tiles, ranges, k_per_split = split.args()
    assert ws is split.workspace and locks is split.owned
    assert (dp_tiles, ranges, k_per_split) == (660, 3, 19)
    # the stream's shared counters where the launch holds none
    shared = gg.SplitTail.of(thirds, 4096, 4096, 7168, 132, out)
    assert shared.owned is None and shared.args()[1].numel() >= 44 * 3
    # no split (a whole last wave, or a tile without the flag): the tiles, and arguments the
    # kernel never reads
    whole = gg.SplitTail.of(replace(thirds, split_tail=False), 4096, 4096, 7168, 132, out)
    assert whole.plan is None and whole.units(704) == 704
    assert whole.args()[2:] == (0, 0, 0)


def test_a_configurations_json_form_leaves_out_a_false_split_tail():
    from ficco.kernels.gluon_configs import config_from_dict, config_to_dict

    cfg = gg.GluonGemmConfig(128, 128, 128, 6, 2, 4, shared_tile=True)
    assert "split_tail" not in config_to_dict(cfg)
    split = replace(cfg, split_tail=True)
    assert config_to_dict(split)["split_tail"] is True
    assert config_from_dict(config_to_dict(split), 1) == split
    assert config_from_dict(config_to_dict(cfg), 1) == cfg


def test_tail_widths_split_into_a_power_of_two_main_part_and_tail():
    parts = {c.block_n: (c.main_n, c.tail_n) for c in gg.BF16_CONFIGS}
    assert parts[192] == (128, 64) and parts[320] == (256, 64) and parts[160] == (128, 32)
    assert parts[256] == (256, 0)
    # the split epilogue halves the main part's store buffer, not the tail's
    half = gg.GluonGemmConfig(128, 320, 64, 3, 1, 8, split_epilogue=True)
    ring = 3 * (128 + 320) * 64 * 2
    assert half.shared_bytes(2) == ring + 128 * (128 + 64) * 2 + 1024
    with pytest.raises(ValueError, match="16-bit inputs only"):
        gg.GluonGemmConfig(128, 192, 128, 3, 1, 8).check(1)


def test_swap_ab_tiles_are_timed_for_decode_rows_only_and_round_trip():
    from ficco.kernels.gluon_configs import SWAP_MAX_ROWS, config_from_dict, config_to_dict

    swap = [c for c in gg.BF16_CONFIGS if c.swap_ab]
    assert swap and not any(c.swap_ab for c in gg.FP8_CONFIGS)
    for cfg in swap:
        assert cfg.name.endswith("_swap")
        assert cfg.suits(1) and cfg.suits(SWAP_MAX_ROWS) and not cfg.suits(SWAP_MAX_ROWS + 1)
        assert config_from_dict(config_to_dict(cfg)) == cfg
        with pytest.raises(ValueError, match="16-bit inputs"):
            cfg.check(1)
    assert all(c.suits(10**6) for c in gg.BF16_CONFIGS if not c.swap_ab)
    # a picks file written before the field reads as no swap
    plain = config_to_dict(PP)
    del plain["swap_ab"]
    assert config_from_dict(plain) == PP


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
    swap = next(c for c in gg.BF16_CONFIGS if c.swap_ab)
    with pytest.raises(ValueError, match="swap-AB tile reads a row-major"):
        gg.ws_gemm_launcher(a, b.t().contiguous().t(), out, swap)


def test_shared_tiles_give_each_consumer_64_rows_and_its_own_store():
    halves = gg.GluonGemmConfig(128, 128, 128, 6, 2, 4, shared_tile=True)
    assert halves.name == "ws_128x128x128_s6_coop2x4" and halves.rows_per_consumer == 64
    # the ring as the 8-warp tile's, a store buffer of 64 rows per consumer
    ring = 6 * (128 + 128) * 128
    assert halves.shared_bytes(1) == ring + 2 * 64 * 128 * 2 + 1024
    # a 64x128 accumulator per 4-warp consumer: 64 registers a thread, as 128x128 on 8 warps
    halves.check(1)
    thirds = gg.GluonGemmConfig(192, 128, 128, 5, 3, 4, split_epilogue=True, shared_tile=True)
    assert thirds.name == "ws_192x128x128_s5_coop3x4_half" and thirds.rows_per_consumer == 64
    assert thirds.shared_bytes(1) == 5 * (192 + 128) * 128 + 3 * 64 * 64 * 2 + 1024
    thirds.check(1)
    with pytest.raises(ValueError, match="bytes of shared memory"):
        gg.GluonGemmConfig(192, 128, 128, 5, 3, 4, shared_tile=True).check(1)
    # the space's shared tiles: cuBLASLt's tile in two row parts, and 192 rows in three
    assert {c.name for c in gg.FP8_CONFIGS if c.shared_tile and not c.split_tail} == {
        "ws_128x128x128_s6_coop2x4",
        "ws_128x128x128_s5_coop2x4_half",
        "ws_192x128x128_s5_coop3x4_half",
        "ws_192x128x128_s4_coop3x4",
    }


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


# --- the shipped picks matmul reads (ficco.kernels.gluon_configs: no Gluon, no GPU) ---


def _picks_file(tmp_path, card, doc):
    path = tmp_path / card / "gluon_gemm_picks.json"
    path.parent.mkdir(parents=True)
    path.write_text(doc if isinstance(doc, str) else __import__("json").dumps(doc))
    return path


@pytest.fixture
def picks_dir(tmp_path, monkeypatch):
    from ficco.kernels import gluon_configs

    monkeypatch.setattr(gluon_configs, "shipped_dir", lambda name: tmp_path)
    gluon_configs.shipped_picks.cache_clear()
    yield tmp_path
    gluon_configs.shipped_picks.cache_clear()


KEY = "NVIDIA H200|triton=3.6.0|bfloat16|m=4096,n=4096,k=2048|sm=132"


def test_picks_are_read_by_tuning_key(picks_dir):
    from ficco.kernels.gluon_configs import config_to_dict, shipped_picks

    cfg = gg.BF16_CONFIGS[4]
    _picks_file(picks_dir, "h200", {"format": 1, "picks": {KEY: {"config": config_to_dict(cfg)}}})
    assert shipped_picks() == {KEY: cfg}


@pytest.mark.parametrize(
    "doc, says",
    [
        ("{not json", "ignoring Gluon GEMM picks"),
        ({"format": 2, "picks": {}}, "format: expected 1"),
        ({"format": 1, "picks": []}, "picks: an object"),
    ],
)
def test_a_corrupt_picks_file_is_refused_with_what_is_wrong(picks_dir, doc, says):
    from ficco.kernels.gluon_configs import shipped_picks

    path = _picks_file(picks_dir, "h200", doc)
    with pytest.warns(UserWarning, match=says) as caught:
        assert shipped_picks() == {}
    assert str(path) in str(caught[0].message)


@pytest.mark.parametrize(
    "config, says",
    [
        ({"block_m": 128}, r"config\.block_n: missing"),
        (
            {
                **dict(block_m=128, block_n=128, block_k=64, stages=4, consumers=2),
                "consumer_warps": "4",
            },
            r"config\.consumer_warps: must be an integer, not a string",
        ),
        (
            {**dict(block_m=128, block_n=256, block_k=64, stages=3, consumers=2, consumer_warps=4)},
            "registers a thread",
        ),
        (
            {
                **dict(
                    block_m=128, block_n=128, block_k=64, stages=4, consumers=2, consumer_warps=4
                ),
                "swizzle": 1,
            },
            "unknown fields",
        ),
    ],
)
def test_a_bad_pick_is_skipped_naming_its_key_and_field(picks_dir, config, says):
    from ficco.kernels.gluon_configs import config_to_dict, shipped_picks

    good = "NVIDIA H200|triton=3.6.0|bfloat16|m=8192,n=4096,k=2048|sm=132"
    picks = {KEY: {"config": config}, good: {"config": config_to_dict(gg.BF16_CONFIGS[0])}}
    _picks_file(picks_dir, "h200", {"format": 1, "picks": picks})
    with pytest.warns(UserWarning, match=says) as caught:
        assert list(shipped_picks()) == [good]
    assert KEY in str(caught[0].message)


def test_fp8_picks_are_checked_as_fp8_configurations(picks_dir):
    from ficco.kernels.gluon_configs import config_from_dict, config_to_dict, shipped_picks

    fp8_key = "NVIDIA H200|triton=3.6.0|float8_e4m3fn|m=4096,n=4096,k=4096|sm=132"
    cfg = next(c for c in gg.FP8_CONFIGS if c.shared_tile)
    # 128-deep FP8 slots: twice the shared memory as 16-bit inputs, so only an FP8 key takes it
    with pytest.raises(ValueError, match="bytes of shared memory"):
        config_from_dict(config_to_dict(cfg))
    assert config_from_dict(config_to_dict(cfg), 1) == cfg
    picks = {fp8_key: {"config": config_to_dict(cfg)}, KEY: {"config": config_to_dict(cfg)}}
    _picks_file(picks_dir, "h200", {"format": 1, "picks": picks})
    with pytest.warns(UserWarning, match="bytes of shared memory") as caught:
        assert shipped_picks() == {fp8_key: cfg}
    assert KEY in str(caught[0].message)


def test_scaled_matmul_offers_the_gluon_kernel_only_what_its_picks_were_measured_on(
    monkeypatch,
):
    import importlib

    from ficco.kernels import scaled

    matmul = importlib.import_module("ficco.kernels.matmul")  # the module, not its function
    cfg = next(c for c in gg.FP8_CONFIGS if c.shared_tile)
    fp8 = torch.float8_e4m3fn
    out = torch.empty((64, 64), dtype=torch.bfloat16)

    def ops(**fields):
        base = dict(
            a=torch.zeros((64, 64), dtype=fp8), b=torch.zeros((64, 64), dtype=fp8),
            b_k_major=True, a_scale=torch.ones(64), b_scale=torch.ones(64), out=out,
            rowwise=True, colwise=True,
        )  # fmt: skip
        return scaled.ScaledOperands(**{**base, **fields})

    # off CUDA no pick is looked up at all
    assert matmul.shipped_gluon_pick(64, 64, 64, fp8, 132, torch.device("cpu")) is None
    monkeypatch.setattr(matmul, "shipped_gluon_pick", lambda *args: cfg)
    assert matmul.scaled_gluon_config(ops(), 132) is cfg
    # per-tensor scales, a row-major b, an fp32 out, an out TMA cannot store: the Triton kernel
    assert matmul.scaled_gluon_config(ops(rowwise=False), 132) is None
    assert matmul.scaled_gluon_config(ops(colwise=False), 132) is None
    assert matmul.scaled_gluon_config(ops(b_k_major=False), 132) is None
    assert matmul.scaled_gluon_config(ops(out=out.float()), 132) is None
    unaligned = torch.empty((64, 80), dtype=torch.bfloat16)[:, 1:65]
    assert matmul.scaled_gluon_config(ops(out=unaligned), 132) is None


def test_a_picks_key_names_its_dtype():
    from ficco.kernels.gluon_configs import key_input_bytes

    assert key_input_bytes(KEY) == 2
    assert key_input_bytes(KEY.replace("bfloat16", "float8_e5m2")) == 1
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        key_input_bytes(KEY.replace("bfloat16", "int4"))
    with pytest.raises(ValueError, match=r"card\|triton=V\|dtype"):
        key_input_bytes("NVIDIA H200|bfloat16|m=1,n=2,k=3")


def test_the_shipped_picks_parse_and_name_their_card():
    import json

    from ficco.kernels.gluon_configs import PICKS_FILE, config_from_dict
    from ficco.shipped import shipped_dir

    files = sorted(shipped_dir("schedules").glob(f"*/{PICKS_FILE}"))
    assert {p.parent.name for p in files} == {"h100", "h200"}
    for path in files:
        doc = json.loads(path.read_text())
        card = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}[path.parent.name]
        assert doc["picks"], path
        for key, entry in doc["picks"].items():
            dtype = key.split("|")[2]
            assert key.startswith(f"{card}|triton=3.6.0|") and key.endswith("|sm=132")
            assert dtype in ("bfloat16", "float8_e4m3fn"), key
            config_from_dict(entry["config"], 1 if dtype.startswith("float8") else 2)
            # picked for running faster than ficco's Triton kernel by the margin, every run
            assert min(entry["triton_over_gluon_per_run"]) >= 1 + doc["margin"]


def test_matmul_leaves_cpu_calls_to_triton_and_refuses_a_bad_switch(monkeypatch):
    from ficco.kernels.matmul import gluon_config, matmul

    a, b, out = _bf16(64, 64, 64)
    assert gluon_config(a, b, out, 132) is None
    monkeypatch.setenv("FICCO_GEMM_GLUON", "yes")
    with pytest.raises(ValueError, match="FICCO_GEMM_GLUON: must be one of 0, 1, got 'yes'"):
        gluon_config(a, b, out, 132)
    with pytest.raises(ValueError, match="FICCO_GEMM_GLUON"):
        matmul(a, b, out)
    monkeypatch.setenv("FICCO_GEMM_GLUON", "0")
    assert gluon_config(a, b, out, 132) is None


# --- scripts/gluon_picks_from_bench.py: which shapes a card's picks name ---


def _bench_run(gains: dict, gpu="NVIDIA H200", dtype="bf16", pick=None):
    pick = pick or (gg.FP8_CONFIGS if dtype == "fp8" else gg.BF16_CONFIGS)[0].name
    rows = [
        {
            "M": m, "N": n, "K": k, "dtype": dtype, "pick": pick,
            "ms": {"gluon": 1.0, "triton": gain, "library": 1.0},
        }
        for (m, n, k), gain in gains.items()
    ]  # fmt: skip
    env = {"gpu": gpu, "triton": "3.6.0", "sm_count": 132}
    return {"environment": env, "rows": rows}


def _picks_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "gluon_picks_from_bench.py"
    spec = importlib.util.spec_from_file_location("gluon_picks_from_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_shape_is_picked_only_where_gluon_won_by_the_margin_in_every_run():
    script = _picks_script()
    close = 1 + script.PICK_MARGIN - 0.001  # just short of the margin
    first = _bench_run(
        {(256, 4096, 2048): 1.05, (512, 4096, 2048): 1.05, (1024, 4096, 2048): close}
    )
    second = _bench_run(
        {(256, 4096, 2048): 1.02, (512, 4096, 2048): close, (1024, 4096, 2048): 1.2}
    )
    chosen, stats = script.picks([first, second])
    assert list(chosen) == ["NVIDIA H200|triton=3.6.0|bfloat16|m=256,n=4096,k=2048|sm=132"]
    assert stats == {"shapes": 3, "picked": 1}
    entry = chosen["NVIDIA H200|triton=3.6.0|bfloat16|m=256,n=4096,k=2048|sm=132"]
    assert entry["triton_over_gluon_per_run"] == [1.05, 1.02]
    # runs of another shape set: a shape counts the runs that measured it, at least two
    decode = _bench_run({(64, 2880, 2048): 1.1, (256, 4096, 2048): 0.9})
    decode2 = _bench_run({(64, 2880, 2048): 1.2, (128, 2880, 2048): 1.3})
    chosen, stats = script.picks([first, second, decode, decode2])
    assert sorted(chosen) == [
        "NVIDIA H200|triton=3.6.0|bfloat16|m=64,n=2880,k=2048|sm=132"
    ] and stats == {"shapes": 5, "picked": 1}
    # a run where the Gluon kernel was not timed at a shape (every configuration failed its
    # check) rules the shape out, however the other runs went
    failed = _bench_run({(64, 2880, 2048): 1.5})
    failed["rows"][0]["ms"].pop("gluon")
    chosen, _ = script.picks([decode, decode2, failed])
    assert chosen == {}
    with pytest.raises(SystemExit, match="different cards"):
        script.picks([first, _bench_run({(256, 4096, 2048): 1.05}, gpu="NVIDIA H100 80GB HBM3")])


def test_a_picks_configuration_is_the_last_runs_pick_or_the_fastest_over_all_runs():
    script = _picks_script()
    fast, slow = gg.BF16_CONFIGS[0].name, gg.BF16_CONFIGS[1].name
    # `fast` ranked first in the first run by far, `slow` first in the second by a hair
    first = _bench_run({(256, 4096, 2048): 1.05}, pick=fast)
    first["rows"][0]["rank_ms"] = {fast: 1.0, slow: 1.2}
    second = _bench_run({(256, 4096, 2048): 1.05}, pick=slow)
    second["rows"][0]["rank_ms"] = {fast: 1.01, slow: 1.0}
    (entry,) = script.picks([first, second])[0].values()
    assert gg.GluonGemmConfig(**entry["config"]).name == slow  # the last run's pick
    (entry,) = script.picks([first, second], config_from="all")[0].values()
    assert gg.GluonGemmConfig(**entry["config"]).name == fast
    assert entry["rank_ms_per_run"] == [1.0, 1.01]
    # a configuration not ranked in every run is never chosen
    del second["rows"][0]["rank_ms"][fast]
    (entry,) = script.picks([first, second], config_from="all")[0].values()
    assert gg.GluonGemmConfig(**entry["config"]).name == slow
    with pytest.raises(ValueError, match="config_from"):
        script.picks([first, second], config_from="best")
    # the rule for one dtype only: bf16 here keeps the last run's pick
    (entry,) = script.picks([first, second], config_from="all", config_dtypes=("fp8",))[0].values()
    assert gg.GluonGemmConfig(**entry["config"]).name == slow and "rank_ms_per_run" not in entry
    with pytest.raises(ValueError, match="config_dtypes"):
        script.picks([first, second], config_from="all", config_dtypes=("fp16",))
    with pytest.raises(ValueError, match="config_dtypes: none"):
        script.picks([first, second], config_from="all", config_dtypes=())


def test_fp8_shapes_are_picked_under_their_own_dtype_and_space():
    script = _picks_script()
    shape = (4096, 4096, 4096)
    bf16 = [_bench_run({shape: 1.1}), _bench_run({shape: 1.1})]
    fp8 = [_bench_run({shape: 1.2}, dtype="fp8"), _bench_run({shape: 1.3}, dtype="fp8")]
    chosen, stats = script.picks(bf16 + fp8)
    base = "NVIDIA H200|triton=3.6.0|{}|m=4096,n=4096,k=4096|sm=132"
    assert sorted(chosen) == [base.format("bfloat16"), base.format("float8_e4m3fn")]
    assert stats == {"shapes": 2, "picked": 2}
    assert chosen[base.format("float8_e4m3fn")]["config"]["block_k"] == gg.FP8_CONFIGS[0].block_k
    # one FP8 run and one bf16 run of a shape are not two runs of either
    chosen, _ = script.picks([bf16[0], fp8[0]])
    assert chosen == {}
    # an FP8 row naming a configuration outside the FP8 space is not picked
    odd = [_bench_run({shape: 1.2}, dtype="fp8", pick=gg.BF16_CONFIGS[0].name)] * 2
    assert script.picks(odd)[0] == {}
    # judged per dtype: the picked FP8 shape's ranked time over the library's
    judged = _bench_run({shape: 1.0}, dtype="fp8")
    judged["rows"][0]["rank_ms"] = {gg.FP8_CONFIGS[0].name: 0.5}
    got = script.judge(script.picks(fp8)[0], judged, "fp8")
    assert got["geomean"] == 2.0 and script.judge({}, judged) == {"shapes": 0}


def test_the_picks_script_does_not_write_over_a_file(tmp_path, capsys, monkeypatch):
    import json
    import sys

    script = _picks_script()
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_bench_run({(256, 4096, 2048): 1.05})))
    out = tmp_path / "picks.json"
    out.write_text("{}")
    monkeypatch.setattr(sys, "argv", ["x", str(run), "--out", str(out)])
    assert script.main() == 2
    assert "--replace" in capsys.readouterr().err and out.read_text() == "{}"
    monkeypatch.setattr(sys, "argv", ["x", str(run), "--out", str(out), "--replace"])
    assert script.main() == 0
    assert json.loads(out.read_text())["picks"] == {}  # one run is not enough
    monkeypatch.setattr(sys, "argv", ["x", str(run), str(run), "--out", str(out), "--replace"])
    assert script.main() == 0
    assert len(json.loads(out.read_text())["picks"]) == 1


def test_picks_judged_on_another_run_take_the_picked_time_else_tritons(tmp_path, capsys):
    import json

    script = _picks_script()
    made = _bench_run({(16, 4096, 2048): 1.25, (16, 2880, 2048): 0.8})
    judged = _bench_run({(16, 4096, 2048): 1.0, (16, 2880, 2048): 1.0, (64, 2880, 2048): 1.0})
    name = gg.BF16_CONFIGS[0].name
    for row in judged["rows"]:  # cuBLAS 1 ms; the Triton kernel 1.0 ms; the pick's rank 0.8 ms
        row["rank_ms"] = {name: 0.8}
    chosen, _ = script.picks([made], min_runs=1)
    got = script.judge(chosen, judged)
    # 16x4096 picked: 1 / 0.8; the others not: 1 / 1.0
    assert got["shapes"] == 3 and got["lowest"] == 1.0 and got["below_0.90"] == 0
    assert got["by_m"]["16"]["geomean"] == round((1.25 * 1.0) ** 0.5, 4)
    assert got["by_m"]["64"]["geomean"] == 1.0
    runs = [tmp_path / "made.json", tmp_path / "judged.json"]
    runs[0].write_text(json.dumps(made))
    runs[1].write_text(json.dumps(judged))
    out = tmp_path / "picks.json"
    for argv, says in (
        ([str(runs[0])], "give --out"),
        ([str(runs[0]), "--judge", str(runs[0])], "is one of the runs"),
        ([str(runs[0]), "--min-runs", "1", "--out", str(out)], "only judges"),
        ([str(runs[0]), "--min-runs", "0", "--judge", str(runs[1])], "at least 1"),
    ):
        with pytest.raises(SystemExit):
            script.main(argv)
        assert says in capsys.readouterr().err
    assert not out.exists()
    assert script.main([str(runs[0]), "--min-runs", "1", "--judge", str(runs[1])]) == 0
    assert json.loads(capsys.readouterr().out)["geomean"] == got["geomean"]


# --- scripts/bench_gluon_gemm.py: its shape sets and summary (no GPU) ---


def _bench_script(name: str = "bench_gluon_gemm"):
    import importlib.util
    import sys
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    sys.path.insert(0, str(scripts))
    try:
        spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(scripts))
    return module


def test_the_decode_set_is_bench_decode_gemms_shapes():
    from ficco.workloads import PHASE_TOKENS

    shapes = _bench_script().decode_set()
    assert len(shapes) == len({s for s, _ in shapes}) == 190
    assert {s[0] for s, _ in shapes} == set(PHASE_TOKENS["decode"])
    assert all(sets == ["decode"] for _, sets in shapes)
    assert shapes[0][0][0] == max(PHASE_TOKENS["decode"])  # most rows first


def test_the_summary_counts_matmuls_shapes_per_set_and_m():
    script = _bench_script()

    def row(m, matmul, dtype="bf16", sets=("decode",), gluon=1.0):
        ratio = {"gluon": gluon, "triton": 0.9}
        if matmul is not None:
            ratio["matmul"] = matmul
        ms = {"gluon": 1.0, "gluon2": 1.0}
        return {
            "M": m, "dtype": dtype, "sets": list(sets), "ms": ms, "ratio": ratio,
            "pick": gg.BF16_CONFIGS[0].name,
        }  # fmt: skip

    rows = [row(1, 1.0), row(1, 0.89, gluon=0.8), row(64, 0.94), row(64, 1.1)]
    rows += [row(512, None, dtype="fp8", sets=("full",))]
    summary = script.summarize(rows)
    decode = summary["bf16_decode"]
    assert decode["shapes"] == 4
    assert decode["matmul_vs_library_min"] == 0.89
    assert (decode["matmul_below_0.95"], decode["matmul_below_0.90"]) == (2, 1)
    assert decode["matmul_vs_library_by_m"]["1"] == pytest.approx((1.0 * 0.89) ** 0.5)
    # the better of the two kernels per shape: 0.9 (Triton) where the Gluon pick ran 0.8
    assert decode["better_of_gluon_and_triton_vs_library_min"] == 0.9
    assert decode["better_of_gluon_and_triton_below_0.90"] == 0
    assert decode["better_of_gluon_and_triton_vs_library_by_m"]["1"] == pytest.approx(0.9**0.5)
    # FP8 rows time no matmul: no figure, not an infinite one
    fp8 = summary["fp8_full"]
    assert fp8["matmul_below_0.95"] == 0 and math.isnan(fp8["matmul_vs_library_min"])
    assert "matmul_vs_library_by_m" not in fp8
    assert decode["picks"] == {gg.BF16_CONFIGS[0].name: 4}


def test_the_benchmarks_row_chunks_arrive_last_rows_first_and_a_local_shard_waits_on_nothing():
    script = _bench_script()
    a = torch.arange(8.0).reshape(8, 1).repeat(1, 4)
    sa, out = torch.arange(8.0).reshape(8, 1), torch.zeros(8, 3)
    views = script.row_chunk_views(a, sa, out, 2)
    assert [v.a[0, 0].item() for v in views] == [4.0, 0.0]  # the last rows first
    assert [v.out.data_ptr() for v in views] == [out[4:].data_ptr(), out.data_ptr()]
    assert all(v.wait is not None and v.wait.item() == 1 for v in views)  # preset
    assert all(v.wait is None for v in script.row_chunk_views(a, sa, out, 2, waits=False))
    local, peer = script.row_chunk_views(a, sa, out, 2, local=True)
    assert local.wait is None and peer.wait is not None
    # the shard's rows and scales in buffers of their own, the same values
    assert local.a.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
    assert torch.equal(local.a, a[4:]) and torch.equal(local.a_scale, sa[4:])
    assert local.out.data_ptr() == out[4:].data_ptr()


def test_the_summary_keeps_the_all_gather_launch_and_the_all_waiting_one_apart():
    script = _bench_script()
    rows = [
        {
            "M": m,
            "dtype": "fp8",
            "sets": ["full"],
            "pick": gg.FP8_CONFIGS[0].name,
            "ms": {"gluon": 1.0, "gluon2": 1.0},
            "fused_kernel": "gluon x",
            "ratio": {"gluon": 1.0, "triton": 0.9, "fused": fused, "fused_waiting": waiting},
        }  # fmt: skip
        for m, fused, waiting in ((512, 1.0, 0.96), (1024, 0.99, 0.98))
    ]
    fp8 = script.summarize(rows)["fp8_full"]
    assert fp8["fused_vs_library_geomean"] == pytest.approx((1.0 * 0.99) ** 0.5)
    assert fp8["fused_waiting_vs_library_geomean"] == pytest.approx((0.96 * 0.98) ** 0.5)
    assert fp8["fused_waiting_vs_library_min"] == 0.96


def test_the_benchmark_recomputes_a_written_runs_summary_without_a_gpu(tmp_path, capsys):
    import json

    script = _bench_script()
    row = {
        "M": 1, "dtype": "bf16", "sets": ["decode"], "pick": gg.BF16_CONFIGS[0].name,
        "ms": {"gluon": 1.0, "gluon2": 1.0}, "ratio": {"gluon": 1.1, "triton": 0.95, "matmul": 1.1},
    }  # fmt: skip
    run = tmp_path / "gluon_gemm.json"
    run.write_text(json.dumps({"rows": [row]}))
    assert script.main(["--summarize", str(run)]) == 0
    decode = json.loads(capsys.readouterr().out)["bf16_decode"]
    assert decode["better_of_gluon_and_triton_vs_library_geomean"] == pytest.approx(1.1)
    with pytest.raises(SystemExit):
        script.main([])
    assert "give --out" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shapes", "1024x3072"], "'1024x3072' is not MxNxK"),
        (["--shapes", "1024x3072x4096,7x7x7"], r"not among the bench_gemm shapes: \[\(7, 7, 7\)\]"),
        (["--set", "decode", "--dtypes", "bf16", "--shapes", "1024x3072x4096"], "decode shapes"),
        (["--set", "decode"], "--set decode: bf16 only"),
        (["--dtypes", "fp16"], "'fp16' is not bf16 or fp8"),
    ],
)
def test_the_benchmark_refuses_bad_arguments_before_any_gpu_work(argv, message, capsys, tmp_path):
    script = _bench_script()
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--out", str(tmp_path / "out"), *argv])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_the_benchmark_selects_the_named_shapes_in_the_sets_order():
    script = _bench_script()
    picked = script.select_shapes("bench_gemm", "1024x3072x4096, 512x5120x8192")
    assert [s for s, _ in picked] == [
        s for s, _ in script.ordered_shapes() if s in {(1024, 3072, 4096), (512, 5120, 8192)}
    ]
    assert len(script.select_shapes("decode", None)) == 190


@pytest.mark.parametrize(
    ("script", "argv", "named"),
    [
        ("library_kernels", ["--set", "decode", "--shapes", "1x2880x2049"], "1, 2880, 2049"),
        ("library_kernels", ["--shapes", "1x2880"], "'1x2880' is not MxNxK"),
        ("bench_decode_gemm", ["--weights", "2880x2049"], "(2880, 2049)"),
        ("bench_decode_gemm", ["--weights", "2880xK"], "'2880xK' is not NxK"),
        ("bench_decode_gemm", ["--weights", "2880"], "'2880' is not NxK"),
    ],
)
def test_the_kernel_scripts_refuse_a_bad_shape_before_any_gpu_work(
    script, argv, named, tmp_path, capsys
):
    module = _bench_script(script)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--out", str(tmp_path / "out"), *argv])
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_benchmark_variant_is_timed_only_once_it_ran_and_matched(monkeypatch):
    script = _bench_script()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    ref = torch.ones(4, 4)
    out = torch.full((4, 4), float("nan"))
    row, fns = {"errors": {}, "failures": {}}, {}

    def right():
        out.copy_(ref)

    prepared = object()
    assert script._admit(row, fns, "ok", right, out, ref, timed=lambda: prepared)
    assert fns == {"ok": prepared} and row["errors"]["ok"] == 0.0

    def wrong():
        out.fill_(2.0)

    assert not script._admit(row, fns, "wrong", wrong, out, ref)
    assert "wrong" not in fns and row["failures"]["wrong"] == "relative error 1"

    def broken():
        raise RuntimeError("no such tile")

    assert not script._admit(row, fns, "broken", broken, out, ref)
    assert "broken" not in fns and "broken" not in row["errors"]
    assert row["failures"]["broken"] == "RuntimeError: no such tile"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--config-from-dtypes", "fp8"], "--config-from-dtypes takes --config-from all"),
        (["--config-from", "all", "--config-from-dtypes", "fp16"], "['fp16']"),
        (["--config-from", "all", "--config-from-dtypes", ","], "--config-from-dtypes: none"),
    ],
)
def test_the_picks_script_refuses_a_dtype_rule_it_cannot_apply(argv, says, tmp_path, capsys):
    script = _picks_script()
    with pytest.raises(SystemExit) as exit_info:
        script.main([str(tmp_path / "run.json"), "--out", str(tmp_path / "picks.json"), *argv])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "picks.json").exists()


def test_the_benchmark_takes_rows_in_the_order_named():
    script = _bench_script()
    decode = script.select_shapes("decode", None)
    picked = script.select_rows(decode, "1, 32,1")
    assert [s[0] for s, _ in picked] == [1] * 19 + [32] * 19
    assert [s for s, _ in picked[:19]] == [s for s, _ in decode if s[0] == 1]
    with pytest.raises(ValueError, match="'0' is not a positive integer"):
        script.select_rows(decode, "0")
    with pytest.raises(ValueError, match=r"no shape of the set has M in \[3\]"):
        script.select_rows(decode, "1,3")


def _compile_script(code: str) -> subprocess.CompletedProcess:
    """``code`` run with scripts/compile_gluon_sm90.py imported as ``c`` (it refuses to load
    under TRITON_INTERPRET, so in a process without it)."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    prelude = "import sys; sys.argv = ['x']; sys.path.insert(0, 'scripts'); "
    prelude += "import compile_gluon_sm90 as c\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, cwd=root, env=env
    )


#: argument lists the compile script refuses, and what its refusal says
COMPILE_REFUSALS = [
    (["--against", "x.json"], "--against needs --digests"),
    (["--fused", "--digests", "x.json"], "--fused compiles another kernel"),
    (["--only", "split", "--digests", "x.json"], "--only compiles part of the space"),
]
PTX_DIGEST_CHECKS = """
base = "mov.u32 %r1, 0;\\n$L__tmp3:\\nadd.s32 %r2, %r1, 1;\\n"
relabelled = "// inlined\\nmov.u32 %r1, 0;\\n\\t.loc 1 2 3\\n$L__tmp9:\\nadd.s32 %r2, %r1, 1;\\n"
debug = base + ".section\\t.debug_info\\n{ .b8 1 }\\n"
changed = base.replace("1;", "2;")
renumbered = base.replace("%r1", "%r9").replace("%r2", "%r4")  # values made in another order
swapped = base.replace("%r1, 1", "%r2, 1")  # another register read: another program
print(c.ptx_digest(base) == c.ptx_digest(relabelled) == c.ptx_digest(debug))
print(c.ptx_digest(base) != c.ptx_digest(changed))
print(c.ptx_digest(base) == c.ptx_digest(renumbered) != c.ptx_digest(swapped))
"""
#: each refused argument list run through ``c.main()`` in the same process: its exit code
#: and what it wrote to stderr, one JSON line each
RUN_REFUSALS = """
import contextlib, io, json
for argv in ARGVS:
    sys.argv, err = ["x", *argv], io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = c.main()
        except SystemExit as stop:
            code = stop.code
    print(json.dumps([code, err.getvalue()]))
"""


@pytest.fixture(scope="module")
def compile_script_answers() -> tuple[subprocess.CompletedProcess, list[str], list]:
    """The PTX digest checks' three lines and each of ``COMPILE_REFUSALS``' [exit code,
    stderr], from one process (the script's import, torch's and Triton's, paid once)."""
    argvs = [argv for argv, _ in COMPILE_REFUSALS]
    got = _compile_script(PTX_DIGEST_CHECKS + f"ARGVS = {argvs!r}" + RUN_REFUSALS)
    if got.returncode and "gluon" in got.stderr.lower():
        pytest.skip(f"this Triton has no Gluon: {got.stderr.strip()[-200:]}")
    assert got.returncode == 0, got.stderr[-2000:]
    lines = got.stdout.splitlines()
    return got, lines[:3], [json.loads(line) for line in lines[3:]]


def test_the_ptx_digest_ignores_debug_lines_labels_and_register_numbering_only(
    compile_script_answers,
):
    _, digests, _ = compile_script_answers
    assert digests == ["True", "True", "True"]


def test_the_compile_script_refuses_bad_arguments(compile_script_answers):
    _, _, refusals = compile_script_answers
    assert len(refusals) == len(COMPILE_REFUSALS)
    for (argv, says), (code, stderr) in zip(COMPILE_REFUSALS, refusals, strict=True):
        assert code == 2 and says in stderr, (argv, code, stderr)
