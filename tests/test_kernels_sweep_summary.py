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


def test_ready_runs_are_compared_with_the_default_launch_that_claims_its_tiles():
    shapes = [
        {
            "timing": _timing(
                cublas=0.1,
                fused_tma=0.12,
                fused_tma_runs=0.108,
                fused_overlap=0.2,
                fused_overlap_arrival=0.16,
                fused_overlap_runs=0.15,
                per_chunk=0.18,
                fused_overlap_early=0.12,
                fused_overlap_arrival_early=0.125,
                fused_overlap_runs_early=0.1,
                per_chunk_early=0.125,
            )  # fmt: skip
        },
    ]
    small = summary.fused({"shapes": shapes})["small"]
    assert small["ready_runs_vs_claims_shapes"] == 1
    assert small["ready_runs_vs_claims"] == pytest.approx(0.9)
    assert small["arrival_ready_runs_vs_claims"] == pytest.approx(0.15 / 0.16)
    assert small["early_arrival_ready_runs_vs_claims"] == pytest.approx(0.8)


def test_ready_runs_of_eaaae54_json_where_runs_were_the_default():
    shapes = [
        {  # runs applied: flags set 0.9x the claimed launch; the schedule's launch is the
            # arriving tile's, early arrivals fused_overlap_arrival_early's
            "timing": _timing(
                cublas=0.1,
                fused_tma=0.108,
                fused_tma_claims=0.12,
                fused_overlap=0.2,
                fused_overlap_arrival=0.15,
                fused_overlap_claims=0.16,
                per_chunk=0.18,
                fused_overlap_early=0.12,
                fused_overlap_arrival_early=0.1,
                fused_overlap_claims_early=0.125,
                per_chunk_early=0.125,
            )  # fmt: skip
        },
        {"timing": _timing(cublas=0.1, fused_tma=0.11, fused_overlap=0.2, per_chunk=0.19)},
    ]  # the second: runs refused, no claimed twin, not counted
    small = summary.fused({"shapes": shapes})["small"]
    assert small["ready_runs_vs_claims_shapes"] == 1
    assert small["ready_runs_vs_claims"] == pytest.approx(0.9)
    assert small["arrival_ready_runs_vs_claims"] == pytest.approx(0.15 / 0.16)
    assert small["early_arrival_ready_runs_vs_claims"] == pytest.approx(0.8)
