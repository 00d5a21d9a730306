"""gemm_ar's add_rms_norm and add_rms_norm_fp8 epilogues (``ficco.patterns.epilogues``) on
GPUs.

One GPU: one process plays W = 2, 4, 8 ranks of lamport1 and lamport2 schedules with the
epilogue (``tests/epilogue_ranks.py``): every rank's plan lowered and its buffers allocated
as the executor does, each norm task issued through the executor's operand mapping as the
fused one-shot or two-shot kernel's launch (phase by phase over the ranks), each rank's
output (``y``; FP8: the e4m3 normed rows dequantized, and the new residual) verified
against the float64 reference. The lanes (one GPU per rank, or W ranks that share one GPU):
every transport's schedules with either epilogue verified and timed beside the baselines
(the unfused ``comm_alone``, the fused ``comm_lamport``); the one-GPU lane refuses lamport1
/ lamport2 and symmetric memory's kernels, as without the epilogue.

    python -m pytest -q tests/gpu/test_gemm_ar_epilogue_gpu.py
"""

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(1)]

from epilogue_ranks import play_ranks  # noqa: E402

from ficco.execute import RunOptions, TimingOptions  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import Schedule, is_legal  # noqa: E402

EPILOGUES = ("add_rms_norm", "add_rms_norm_fp8")


def normed(m, n, k, world, dtype="bf16", epilogue="add_rms_norm") -> Problem:
    return Problem(pattern="gemm_ar", m=m, n=n, k=k, world=world, dtype=dtype, epilogue=epilogue)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize(
    ("m", "n", "schedule"),
    [
        (1, 8192, "serial/lamport1/cublas"),  # a decode row of a 8192-wide model
        (13, 4096, "finer-c2-m/lamport1/cublas"),  # ragged row chunks, one launch each
        (64, 5120, "finer-c4-m/lamport1/cublas"),
        (1, 8192, "serial/lamport2/cublas"),  # one row: the other slices empty
        (13, 4096, "finer-c2-m/lamport2/cublas"),  # row slices of 7/6 rows split W ways
        (512, 4096, "serial/lamport2/cublas"),
    ],
)
def test_the_fused_kernel_through_the_schedule_path_on_one_gpu(m, n, schedule, world, dtype):
    problem = normed(m, n, 256, world, dtype)
    checks = play_ranks(problem, Schedule.parse(schedule), device="cuda")
    for rank, check in enumerate(checks):
        assert check.ok, (rank, check)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize(
    ("m", "n", "schedule"),
    [
        (1, 8192, "serial/lamport1/cublas"),
        (13, 4096, "finer-c2-m/lamport1/cublas"),
        (1, 8192, "serial/lamport2/cublas"),
        # row slices of 7/6 rows: each owner's e4m3 rows sent in the scratch's dtype
        (13, 4096, "finer-c2-m/lamport2/cublas"),
        (512, 4096, "serial/lamport2/cublas"),
    ],
)
def test_the_fused_fp8_kernels_through_the_schedule_path_on_one_gpu(m, n, schedule, world, dtype):
    """The FP8 output of both fused kernels (GPU cvt.rn.satfinite), dequantized and checked
    element by element against float64, about 2% of the values saturated."""
    problem = normed(m, n, 256, world, dtype, epilogue="add_rms_norm_fp8")
    checks = play_ranks(problem, Schedule.parse(schedule), device="cuda")
    for rank, check in enumerate(checks):
        assert check.ok, (rank, check)


SCHEDULES = (
    "serial/nccl/cublas",
    "finer-c2-m/nccl/cublas",
    "finer-c2-n/nccl/cublas",  # column chunks: one norm after the last
    "finer-c4-m/ce/cublas",
    "finer-c2-m/ce/triton+fused",
    "finer-c2-m/ce/cublas+rs_ag",
    "serial/symm2/cublas",
    "serial/lamport1/cublas",  # fused: the norm in the all-reduce's launch
    "finer-c4-m/lamport1/cublas+hi",
    "finer-c2-m/lamport2/cublas",  # fused too: the two-shot kernel over whole rows
)


@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize(("m", "dtype"), [(8, "bf16"), (96, "fp32")])
def test_epilogue_schedules_verify_and_time_beside_the_baselines(m, dtype, epilogue, lane):
    problem = normed(m, 2048, 512, lane.world, dtype, epilogue)
    schedules = [s for s in map(Schedule.parse, SCHEDULES) if is_legal(problem, s)]
    opts = RunOptions(timing=TimingOptions(rounds=3, warmup=1))
    by = {meas.name: meas for meas in lane.run(problem, schedules, opts)}
    refused = ("+fused", "symm", "lamport")  # kernels that need distinct GPUs
    for s in schedules:
        got = by[str(s)]
        if lane.shared and any(r in str(s) for r in refused):
            assert got.verdict == "unavailable", (str(s), got.verdict, got.detail)
            continue
        assert got.verdict == "ok", (str(s), got.detail)
        assert got.median_ms > 0
    for name in ("gemm_alone", "comm_alone", "serial_eager"):
        assert by[name].verdict == "ok", (name, by[name].detail)
    want = "unavailable" if lane.shared else "ok"
    assert by["comm_lamport"].verdict == want, by["comm_lamport"].detail
    if not lane.shared:
        for fused in ("serial/lamport1/cublas", "finer-c2-m/lamport2/cublas"):
            assert by[fused].extra["graph"] == "graph", (fused, by[fused].extra["graph"])
