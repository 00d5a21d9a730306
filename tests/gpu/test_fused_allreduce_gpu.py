"""gemm_ar's fused schedules on GPUs: the fused GEMM's multi-destination epilogue on one GPU,
then every kind of gemm_ar ``+fused`` schedule verified, captured and timed on 2 GPUs
(skipped without the GPUs they need).

    python -m pytest -q tests/gpu/test_fused_allreduce_gpu.py
"""

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.gpus(1),
]

from ficco.execute import RunOptions, TimingOptions  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import Schedule, is_legal  # noqa: E402

two_gpus = pytest.mark.gpus(
    2,
    why="fused schedules wait on peers' flags inside a kernel, and kernels of ranks that share "
    "a GPU do not run concurrently",
)

# --- the kernel: one tile computed once, stored to every destination (one GPU) ---------------


def _copies_case(destinations: int):
    """Two row chunks (one ragged) of a [700, 1096] @ [1096, 1000] bf16 GEMM, each stored into
    ``destinations`` separate buffers, every destination with its own flag."""
    from ficco.kernels.fused import FusedChunkViews, FusedCopyViews

    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(700, 1096, device=dev, generator=gen).to(torch.bfloat16)
    b = torch.randn(1096, 1000, device=dev, generator=gen).to(torch.bfloat16)
    outs = [
        torch.full((700, 1000), float("nan"), device=dev, dtype=torch.bfloat16)
        for _ in range(destinations)
    ]
    flags = torch.zeros(2 * destinations, dtype=torch.int32, device=dev)
    chunks = [
        FusedChunkViews(
            a[lo:hi],
            outs[0][lo:hi],
            signal=flags[j : j + 1],
            copies=tuple(
                FusedCopyViews(out[lo:hi], flags[2 * d + j : 2 * d + j + 1])
                for d, out in enumerate(outs[1:], start=1)
            ),
        )
        for j, (lo, hi) in enumerate(((0, 384), (384, 700)))
    ]
    return chunks, a, b, outs, flags


@pytest.mark.parametrize("path", ["tma", "ptr"])
def test_every_destination_gets_the_same_tile_and_its_flag(path):
    from ficco.kernels.fused import FusedGemm
    from ficco.kernels.fused_configs import tma_supported

    if path == "tma" and not tma_supported(torch.device("cuda", 0)):
        pytest.skip("no TMA here")
    chunks, a, b, outs, flags = _copies_case(4)
    kernel = FusedGemm(chunks, b, sm_budget=132, timeout_s=5.0, path=path)
    kernel()
    torch.cuda.synchronize()
    kernel.raise_on_timeout("test")
    want = a.float() @ b.float()
    err = (outs[0].float() - want).norm() / want.norm()
    assert err < 1e-2, float(err)
    assert all(torch.equal(outs[0], out) for out in outs[1:])  # one tile, stored 4 times
    assert flags.tolist() == [1] * 8
    for _ in range(2):  # back to back: the counters reset themselves, flags set again
        flags.zero_()
        kernel()
    torch.cuda.synchronize()
    assert flags.tolist() == [1] * 8


def test_a_wait_sees_the_copies_flags_and_times_out_on_one_never_set():
    from ficco.kernels.fused import FlagTimeout, FlagWait, FusedGemm

    chunks, a, b, outs, flags = _copies_case(3)
    kernel = FusedGemm(chunks, b, sm_budget=120, timeout_s=5.0)
    never = torch.zeros(1, dtype=torch.int32, device=flags.device)
    arrived = FlagWait(
        [flags[2:3], flags[5:6]], ["copy 1 chunk 0", "copy 2 chunk 1"], timeout_s=5.0
    )
    missing = FlagWait([flags[4:5], never], ["copy 2 chunk 0", "never"], timeout_s=0.3)
    for wait in (arrived, missing):
        wait.compile()
    kernel.compile()
    kernel()
    arrived()
    missing()
    torch.cuda.synchronize()
    arrived.raise_on_timeout("owner")
    with pytest.raises(FlagTimeout, match="flag of never"):
        missing.raise_on_timeout("owner")


# --- the schedules, on 2 GPUs --------------------------------------------------------------

SCHEDULES = (
    "finer-c2-m/ce/triton+fused",
    "finer-c4-m/ce/triton+fused+hi",
    "finer-c8-m/ce/triton+fused+sm16+hi",
    "shard/ce/triton+fused+hi+rs_ag",
    "finer-c2-m/ce/triton+fused+rs_ag",
)


@two_gpus
@pytest.mark.parametrize(
    ("m", "dtype"),
    [(13, "bf16"), (512, "bf16"), (2048, "bf16"), (96, "fp32")],  # ragged; decode; prefill
)
def test_fused_schedules_verify_and_are_timed_as_graphs(m, dtype):
    from ficco.execute.run import run_problem

    problem = Problem(pattern="gemm_ar", m=m, n=1024, k=512, world=2, dtype=dtype)
    schedules = [s for s in map(Schedule.parse, SCHEDULES) if is_legal(problem, s)]
    assert any(s.all_reduce.value == "direct" for s in schedules)
    opts = RunOptions(timing=TimingOptions(rounds=3, warmup=1))
    results = run_problem(problem, [Schedule(), *schedules], backend="cuda", options=opts)
    by = {r.schedule: r for r in results}
    for s in schedules:
        got = by[str(s)]
        assert got.ok, (str(s), got.detail)
        assert got.median_ms > 0
        graph = got.measurement.extra["graph"]
        assert graph == "graph", (str(s), graph)
