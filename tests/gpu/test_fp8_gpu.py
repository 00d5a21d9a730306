"""The FP8 GEMM on a CUDA GPU: ``torch._scaled_mm`` through ``scaled_matmul`` computes what the
CPU emulation computes from the same e4m3 bits, for every pair of scale granularities (odd M
included), or is refused naming the cause: on a GPU below compute capability 8.9, and for
e5m2 x e5m2 (cuBLASLt has no such GEMM).

Skipped without CUDA. The two differ only in where the scales are applied (the GPU's epilogue,
the emulation's upcast) and in summation order: a few bf16 roundings of the largest output.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ficco.execute.scaled import quantize  # noqa: E402
from ficco.kernels import scaled_mm  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.verdict import Unavailable  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", torch.cuda.current_device())
REFUSAL = scaled_mm.gpu_refusal("fp8_e4m3", DEV)


@pytest.mark.skipif(REFUSAL is not None, reason=f"this GPU or torch has no FP8 GEMM: {REFUSAL}")
@pytest.mark.parametrize(("a_scale", "b_scale"), [("tensor", "tensor"), ("row", "column"),
                                                  ("row", "tensor"), ("tensor", "column")])  # fmt: skip
def test_scaled_mm_on_the_gpu_is_the_cpu_emulation(a_scale, b_scale):
    p = Problem(pattern="ag_gemm", m=2, n=256, k=512, world=2, dtype="fp8_e4m3",
                a_scale=a_scale, b_scale=b_scale)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    a, sa = quantize(p, "a", torch.randn(77, 512, generator=gen))
    b, sb = quantize(p, "b", torch.randn(512, 256, generator=gen))
    cpu = scaled_mm.scaled_matmul(a, b, sa, sb)
    gpu = scaled_mm.scaled_matmul(a.to(DEV), b.to(DEV), sa.to(DEV), sb.to(DEV))
    assert gpu.dtype is torch.bfloat16 and gpu.shape == (77, 256)
    scale = cpu.float().abs().max().item()
    assert (gpu.cpu().float() - cpu.float()).abs().max().item() <= 4 * 2**-8 * scale


@pytest.mark.skipif(REFUSAL is not None, reason=f"this GPU or torch has no FP8 GEMM: {REFUSAL}")
@pytest.mark.parametrize(("rows", "start"), [(1, 3), (2, 2), (6, 6), (5, 0), (4, 1), (16, 16)])
def test_a_row_wise_chunk_of_any_rows_and_offset_runs(rows, start):
    """A plan's chunk GEMM takes a few rows at any offset of its buffer, their row scales
    with them; cuBLASLt's row-wise GEMM takes scales at aligned addresses only
    (``scaled_mm.aligned_scales``)."""
    p = Problem(pattern="ag_gemm", m=2, n=64, k=64, world=2, dtype="fp8_e4m3",
                a_scale="row", b_scale="column")  # fmt: skip
    a, sa = quantize(p, "a", torch.randn(32, 64))
    b, sb = quantize(p, "b", torch.randn(64, 64))
    a, sa, b, sb = a.to(DEV), sa.to(DEV), b.to(DEV), sb.to(DEV)
    chunk, scales = a[start : start + rows], sa[start : start + rows]
    gpu = scaled_mm.scaled_matmul(chunk, b[:, 16:48], scales, sb[:, 16:48], check_values=False)
    cpu = scaled_mm.scaled_matmul(chunk.cpu(), b[:, 16:48].cpu(), scales.cpu(), sb[:, 16:48].cpu())
    assert gpu.shape == (rows, 32)
    scale = cpu.float().abs().max().item()
    assert (gpu.cpu().float() - cpu.float()).abs().max().item() <= 4 * 2**-8 * scale


@pytest.mark.skipif(REFUSAL is not None, reason=f"this GPU or torch has no FP8 GEMM: {REFUSAL}")
def test_e5m2_times_e5m2_is_refused_naming_cublaslt():
    """cuBLASLt multiplies e5m2 only by e4m3; an fp8_e5m2 problem holds both in e5m2."""
    p = Problem(pattern="ag_gemm", m=2, n=16, k=16, world=2, dtype="fp8_e5m2")
    a, sa = quantize(p, "a", torch.randn(4, 16))
    b, sb = quantize(p, "b", torch.randn(16, 16))
    with pytest.raises(Unavailable, match="e5m2 x fp8_e5m2"):
        scaled_mm.scaled_matmul(a.to(DEV), b.to(DEV), sa.to(DEV), sb.to(DEV))
    # what the refusal stands in for: torch refuses the pair itself
    with pytest.raises((RuntimeError, ValueError), match="Float8_e5m2"):
        torch._scaled_mm(a.to(DEV), b.to(DEV).t().contiguous().t(), scale_a=sa.to(DEV).reshape(()),
                         scale_b=sb.to(DEV).reshape(()), out_dtype=torch.bfloat16)  # fmt: skip


@pytest.mark.skipif(REFUSAL is None, reason="this GPU runs FP8 GEMMs")
def test_a_gpu_without_fp8_refuses_naming_why():
    p = Problem(pattern="ag_gemm", m=2, n=16, k=16, world=2, dtype="fp8_e4m3")
    a, sa = quantize(p, "a", torch.randn(4, 16))
    b, sb = quantize(p, "b", torch.randn(16, 16))
    with pytest.raises(Unavailable, match="compute capability|_scaled_mm"):
        scaled_mm.scaled_matmul(a.to(DEV), b.to(DEV), sa.to(DEV), sb.to(DEV))


@pytest.mark.skipif(REFUSAL is not None, reason=f"this GPU or torch has no FP8 GEMM: {REFUSAL}")
@pytest.mark.gpus(2, why="the FP8 baselines are collectives over 2 GPUs")
@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs", "gemm_ar"])
def test_the_fp8_baselines_verify_and_time_on_two_gpus(pattern):
    """serial NCCL + torch._scaled_mm, and async-TP's scaled op where the pattern and this
    torch have one: verified against the reference from the dequantized inputs, then timed
    (no schedule is asked for: ``test_fp8_lane.py`` runs the schedules)."""
    from ficco.execute.options import RunOptions, TimingOptions
    from ficco.execute.pool import PoolFailure
    from ficco.execute.run import backend_pool, measure_in

    p = Problem(pattern=pattern, m=512, n=1024, k=2048, world=2, dtype="fp8_e4m3",
                a_scale="row", b_scale="column")  # fmt: skip
    timing = TimingOptions(warmup=1, rounds=3, graphs="none")
    with backend_pool("cuda", 2, RunOptions()) as pool:
        measured = measure_in(pool, p, [], timing)  # the baselines alone
    assert not isinstance(measured, PoolFailure), measured
    got = {m.name: m for m in measured}
    assert got["serial_eager"].verdict == "ok", got["serial_eager"].detail
    assert got["serial_eager"].median_ms > 0
    if pattern != "gemm_ar":  # PyTorch has no fused scaled matmul + all-reduce
        tp = got["async_tp"]
        assert tp.verdict == "ok" or (tp.verdict == "unavailable" and "has no" in tp.detail)
