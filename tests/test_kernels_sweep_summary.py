"""scripts/kernels_sweep_summary.py on a hand-made fused JSON: the bands, the ratios to cuBLAS,
and the chunk-group counts come out as the rows say."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import kernels_sweep_summary as summary  # noqa: E402


def _timing(**ms):
    return {name: {"median_ms": value} for name, value in ms.items()}


SHAPES = [
    {  # small, grouped: chunk by chunk 1.5x slower with flags set, arrivals 0.8x
        "timing": _timing(
            cublas=0.1,
            fused_tma=0.11,
            triton=0.1,
            fused_tma_chunkwise=0.165,
            fused_overlap=0.2,
            fused_overlap_chunkwise=0.25,
            per_chunk=0.21,
        )  # fmt: skip
    },
    {  # small, chunk by chunk: its own figure counts for the chunkwise geomean
        "timing": _timing(
            cublas=0.2,
            fused_tma=0.24,
            triton=0.2,
            fused_overlap=0.3,
            per_chunk=0.28,
        )  # fmt: skip
    },
    {"timing": _timing(cublas=1.0, fused_tma=1.02, triton=1.01, fused_overlap=1.2, per_chunk=1.3)},
]


def test_fused_bands_ratios_and_groups():
    got = summary.fused({"shapes": SHAPES})
    small, large = got["small"], got["large"]
    assert small["shapes"] == 2 and large["shapes"] == 1
    assert small["fused_tma_time_vs_cublas"] == pytest.approx(math.sqrt(1.1 * 1.2))
    assert small["fused_tma_chunk_by_chunk_time_vs_cublas"] == pytest.approx(math.sqrt(1.65 * 1.2))
    assert small["chunks_grouped"] == "1 of 2"
    assert small["fused_overlap_grouped_vs_chunk_by_chunk"] == pytest.approx(0.8)
    assert small["fused_overlap_beats_per_chunk"] == "1 of 2"
    assert large["fused_overlap_beats_per_chunk"] == "1 of 1"
    assert math.isnan(large["fused_overlap_grouped_vs_chunk_by_chunk"])


def test_summarize_reads_the_folder_and_says_what_it_cannot_read(tmp_path):
    (tmp_path / "fused_single_gpu.json").write_text(
        json.dumps({"fingerprint": {"gpu": "NVIDIA H200"}, "shapes": SHAPES})
    )
    (tmp_path / "bench_gemm.json").write_text("{not json")
    found = summary.summarize(tmp_path)
    assert found["fused_single_gpu.json"]["gpu"] == "NVIDIA H200"
    assert found["fused_single_gpu.json"]["small"]["shapes"] == 2
    assert "unreadable" in found["bench_gemm.json"]["error"]
    assert "bench_decode_gemm.json" not in found


def test_the_arriving_tile_and_early_arrivals_are_counted_against_per_chunk():
    shapes = [
        {  # the arriving tile differs: 0.75x the flags-set tile, and beats per_chunk
            "timing": _timing(
                cublas=0.1,
                fused_tma=0.11,
                fused_overlap=0.2,
                fused_overlap_arrival=0.15,
                per_chunk=0.18,
                fused_overlap_early=0.12,
                fused_overlap_arrival_early=0.13,
                per_chunk_early=0.125,
            )  # fmt: skip
        },
        {  # the same tile: fused_overlap is the launch, and loses
            "timing": _timing(
                cublas=0.1,
                fused_tma=0.11,
                fused_overlap=0.2,
                per_chunk=0.19,
                fused_overlap_early=0.11,
                per_chunk_early=0.12,
            )  # fmt: skip
        },
    ]
    small = summary.fused({"shapes": shapes})["small"]
    assert small["arriving_tile_differs"] == "1 of 2"
    assert small["arriving_tile_vs_fused_overlap"] == pytest.approx(0.75)
    assert small["arriving_tile_beats_per_chunk"] == "1 of 2"
    assert small["fused_overlap_beats_per_chunk"] == "0 of 2"
    # early: the arriving tile 0.13 loses to 0.125; the second launch 0.11 wins
    assert small["early_arrivals_arriving_tile_beats_per_chunk"] == "1 of 2"
    assert small["early_arrivals_arriving_tile_vs_fused_overlap"] == pytest.approx(0.13 / 0.12)
    # the launch a schedule makes / per_chunk: 0.15 / 0.18 and 0.2 / 0.19; early 0.13 / 0.125
    # and 0.11 / 0.12; the flags-set tile's launch 0.2 / 0.18 and 0.2 / 0.19
    assert small["launch_vs_per_chunk"] == pytest.approx(((0.15 / 0.18) * (0.2 / 0.19)) ** 0.5)
    assert small["flags_set_tile_launch_vs_per_chunk"] == pytest.approx(
        ((0.2 / 0.18) * (0.2 / 0.19)) ** 0.5
    )
    assert small["early_arrivals_launch_vs_per_chunk"] == pytest.approx(
        ((0.13 / 0.125) * (0.11 / 0.12)) ** 0.5
    )


# One shape both ways: ready runs 0.108 ms flags set against 0.12 claimed; the schedule's
# launch (the arriving tile) 0.15 against 0.16 late, 0.1 against 0.125 with early copies
RUNS = dict(fused_tma=0.108, arrival=0.15, arrival_early=0.1)
CLAIMS = dict(fused_tma=0.12, arrival=0.16, arrival_early=0.125)
COMMON = dict(
    cublas=0.1, fused_overlap=0.2, per_chunk=0.18, fused_overlap_early=0.12, per_chunk_early=0.125
)


@pytest.mark.parametrize("naming", ["cf4dd4e", "eaaae54", "both"])
def test_ready_runs_are_compared_with_the_same_launch_claiming_its_tiles(naming):
    """cf4dd4e: *_runs beside the default (claims); eaaae54: *_claims beside the default
    (runs); both: *_runs and *_claims beside a default that takes runs by its rule."""
    default, twins = {
        "cf4dd4e": (CLAIMS, {"runs": RUNS}),
        "eaaae54": (RUNS, {"claims": CLAIMS}),
        "both": (dict(fused_tma=0.3, arrival=0.3, arrival_early=0.3), {"runs": RUNS, "claims": CLAIMS}),
    }[naming]  # fmt: skip
    timing = _timing(
        **COMMON,
        fused_tma=default["fused_tma"],
        fused_overlap_arrival=default["arrival"],
        fused_overlap_arrival_early=default["arrival_early"],
        **{
            name: twin[key]
            for kind, twin in twins.items()
            for name, key in (
                (f"fused_tma_{kind}", "fused_tma"),
                (f"fused_overlap_{kind}", "arrival"),
                (f"fused_overlap_{kind}_early", "arrival_early"),
            )
        },
    )
    # the second shape: runs refused, no twin, not counted
    plain = _timing(cublas=0.1, fused_tma=0.11, fused_overlap=0.2, per_chunk=0.19)
    if naming == "both":  # the JSON records the rule's answer
        rule = {"fused_tma": "default", "launch": "default"}
        shapes = {8: {"timing": timing, "ready_runs": rule}}
    else:  # inferred: 2 chunks x 2 x 4 tiles of 64x64 = 16 tiles, against 8 or 132 SMs
        shape = {"m": 256, "n": 256, "k": 64, "world": 2, "chunks": 1}
        row = {"timing": timing, "shape": shape, "configs": {"fused_tma": "64x64x64_g8_s3_w4"}}
        row["arrival"] = {"config": "64x64x64_g8_s3_w4"}  # the launch's: 16 tiles, 4 or 128
        shapes = {8: row, 132: row}
    for sms, row in shapes.items():
        d = {"shapes": [row, {"timing": plain}], "fingerprint": {"sm_count": sms}}
        small = summary.fused(d)["small"]
        assert small["ready_runs_vs_claims_shapes"] == 1
        assert small["ready_runs_vs_claims"] == pytest.approx(0.9)
        assert small["arrival_ready_runs_vs_claims"] == pytest.approx(0.15 / 0.16)
        assert small["early_arrival_ready_runs_vs_claims"] == pytest.approx(0.8)
        several = sms == 8
        assert small["ready_runs_vs_claims_several_tiles_shapes"] == int(several)
        assert small["ready_runs_vs_claims_one_tile_shapes"] == int(not several)
        split = "several_tiles" if several else "one_tile"
        assert small[f"ready_runs_vs_claims_{split}"] == pytest.approx(0.9)
        # the launch the rule takes: fused_tma where recorded, else runs (several) or claims
        by_rule = 3.0 if naming == "both" else (1.08 if several else 1.2)
        assert small["fused_tma_by_rule_time_vs_cublas"] == pytest.approx(by_rule)
        # the schedule's launch the rule takes, against per_chunk (0.18; early 0.125)
        late, early = (
            (0.3, 0.3) if naming == "both" else ((0.15, 0.1) if several else (0.16, 0.125))
        )
        assert small["launch_by_rule_vs_per_chunk"] == pytest.approx(late / 0.18)
        assert small["early_arrivals_launch_by_rule_vs_per_chunk"] == pytest.approx(early / 0.125)


def test_one_committed_json_is_summarized_by_its_name(tmp_path):
    path = tmp_path / "fused_single_gpu_callX.json"
    path.write_text(json.dumps({"shapes": SHAPES, "fingerprint": {"gpu": "H"}}))
    found = summary.summarize(path)
    assert list(found) == ["fused_single_gpu_callX.json"]
    assert found["fused_single_gpu_callX.json"]["gpu"] == "H"
    assert found["fused_single_gpu_callX.json"]["large"]["shapes"] == 1
    assert summary.kind_of(tmp_path / "bench_decode_gemm_run4.json")[0] == "bench_decode_gemm.json"
    other = tmp_path / "notes.json"
    other.write_text("{}")
    assert "not a bench_gemm" in summary.summarize(other)["notes.json"]["error"]
