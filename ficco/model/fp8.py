"""What the cost model's FP8 (scaled e4m3 / e5m2) GEMM price rests on.

No FP8 overlap schedule has been timed on two GPUs, so nothing here is calibrated against a
timed run: an FP8 problem is priced with the bf16 calibration (transfers, NCCL, contention,
host costs, the GEMM roofline's launch, HBM efficiency, tiles and shape residuals) and two
FP8 figures measured on one H200:

- the roof (``profiles/h200/fp8_gemm_callJ.json``: 56 shapes of ``scripts/bench_fp8_gemm.py``,
  e4m3, per-row A and per-column B scales, fp32 promotion every 128 products, beside
  ``profiles/h200/bench_gemm.json``, the same 56 shapes in bf16): ``torch._scaled_mm`` runs
  the compute-bound shapes (the 30 of at least 2 x 4096^3 FLOPs) a median 1.760x faster than
  cuBLAS's bf16 GEMM (1,354 against 764 TFLOP/s), so the fitted bf16 peak is multiplied by
  that; the roofline's bytes are A and B at one byte
  an element, the bf16 output at two and fp32 scales at four a row and column. Against the 56
  measured ``_scaled_mm`` times it is off by 5.7% on average (log error), 32% at worst;
- ficco's own FP8 GEMM (the ``triton`` GEMM choice: ``ficco.kernels.scaled``'s
  ``scaled_matmul``, which dispatches to the warp-specialized Gluon kernel on sm_90) runs at
  1.0068x ``_scaled_mm``'s speed (geomean over the 40 full shapes, ``matmul_vs_library_geomean``
  of ``profiles/h200/gluon_gemm_fp8_callCA.json``), in place of the bf16 Triton ratio.

``tests/test_model_fp8.py`` recomputes the figures from the committed JSON. A machine of
another GPU has no measured FP8 figure: its description's ``tflops`` (fp8 peak over bf16 peak,
the vendor's dense figures) stand in for the roof ratio, and the Triton ratio stays the H200's;
both are assumptions, and :data:`FP8_BASIS` says so in every FP8 prediction.
"""

from __future__ import annotations

from ficco.model.machine import Machine

#: the one-GPU measurements the FP8 figures come from (repository paths)
FP8_GEMM_SOURCE = "profiles/h200/fp8_gemm_callJ.json"
BF16_GEMM_SOURCE = "profiles/h200/bench_gemm.json"
#: the GPU those measurements ran on (``Machine.gpu``)
MEASURED_GPU = "NVIDIA H200"
#: FLOPs from which a shape counts as compute-bound in the roof ratio's median (2 x 4096^3)
COMPUTE_BOUND_FLOPS = 2 * 4096**3
#: cuBLAS bf16 ms / ``_scaled_mm`` FP8 ms, median over the compute-bound shapes
FP8_OVER_BF16_CUBLAS = 1.7603
FP8_TRITON_SOURCE = "profiles/h200/gluon_gemm_fp8_callCA.json"
#: ficco's FP8 GEMM ms / ``_scaled_mm`` ms (1 / its throughput ratio over the full shapes)
FP8_TRITON_VS_CUBLAS = 1 / 1.00675

#: what an FP8 prediction rests on, as ``ficco predict`` prints it and its JSON carries it
FP8_BASIS = (
    "predicted from an uncalibrated FP8 model: no FP8 overlap schedule was ever timed; the "
    "bf16 calibration (transfers, NCCL, contention, host costs), fp8 inputs moved at one byte "
    "an element (plus fp32 row scales) and bf16 outputs at two, and the GEMM's FP8 roof "
    "measured on one H200 "
    f"({FP8_GEMM_SOURCE}: _scaled_mm {FP8_OVER_BF16_CUBLAS:.3f}x cuBLAS bf16's speed; "
    f"{FP8_TRITON_SOURCE}: ficco's FP8 GEMM {FP8_TRITON_VS_CUBLAS:.3f}x _scaled_mm's time)"
)


def fp8_roof_ratio(machine: Machine) -> tuple[float, bool]:
    """(FP8 GEMM speed over bf16 at the roof, measured) on ``machine``: the H200's measured
    ratio, or the description's vendor peaks (``tflops``) on another GPU. Raises where the
    description has neither."""
    if machine.gpu == MEASURED_GPU:
        return FP8_OVER_BF16_CUBLAS, True
    peaks = machine.tflops or {}
    if "fp8_e4m3" in peaks and "bf16" in peaks:
        return peaks["fp8_e4m3"] / peaks["bf16"], False
    raise ValueError(
        f"machine: {machine.name} ({machine.gpu}) has no measured FP8 GEMM and its tflops "
        "names no fp8_e4m3 and bf16 peaks: the cost model cannot price an FP8 GEMM there"
    )


def fp8_gemm_bytes(m: int, n: int, k: int) -> int:
    """HBM bytes of one FP8 GEMM ``[m, k] x [k, n]``: fp8 operands, a bf16 output, and fp32
    scales for every row of A and column of B (the row-wise/column-wise upper bound; a
    per-tensor scale is 4 bytes)."""
    return m * k + k * n + 2 * m * n + 4 * (m + n)
