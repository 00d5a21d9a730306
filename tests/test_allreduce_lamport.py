"""ficco's one-shot / two-shot all-reduce kernels with epoch-valued flags (lamport1, lamport2):
the kernels under the Triton interpreter with one process playing every rank (phase by
phase), replayed on the same buffers as a CUDA graph replays them, a stale flag refused, and
gemm_ar's lamport schedules run and verified by W processes over shared files (the kernels
spinning on each other's flags)."""

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from ficco.execute import Verdict, run_problem  # noqa: E402
from ficco.execute.options import RunOptions  # noqa: E402
from ficco.kernels import allreduce_lamport as lam  # noqa: E402
from ficco.kernels.flags import FlagTimeout  # noqa: E402
from ficco.plan import CollectiveOp, build_plan  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import Gemm, Schedule, SpaceOptions, Transport, enumerate_schedules  # noqa: E402
from ficco.space.transports import LAMPORT_ONE_SHOT, LAMPORT_TWO_SHOT  # noqa: E402

KINDS = (LAMPORT_ONE_SHOT, LAMPORT_TWO_SHOT)
LAMPORT = (Transport.LAMPORT1, Transport.LAMPORT2)


def run_call(ws, kind, srcs, dsts, skip_push=()):
    """One call on every rank, phase by phase (every rank's phase 1, then phase 2, ...);
    ranks in ``skip_push`` never push (their first phase is left out)."""
    for i, phase in enumerate(lam.phases_of(kind)):
        for r, w in enumerate(ws):
            if i == 0 and r in skip_push:
                continue
            lam.all_reduce(w, kind, srcs[r], dsts[r], phases=phase)


def rank_order_fp32(srcs):
    total = srcs[0].float()
    for s in srcs[1:]:
        total = total + s.float()
    return total.to(srcs[0].dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("world", "dtype", "shape"),
    [
        (2, torch.float32, (5, 7)),  # ragged: 35 elements
        (4, torch.float16, (3, 123)),  # slices of 93 elements, the last one short
        (8, torch.float32, (1, 5)),  # fewer elements than ranks: empty two-shot slices
        (2, torch.float16, (2, 1100)),  # more than one block per program row
    ],
)
def test_every_rank_gets_the_rank_order_fp32_sum_on_every_replay(kind, world, dtype, shape):
    """Four calls on the same workspace (each slot used, then the first one reused), fresh
    inputs each call: every rank holds the fp32 rank-order sum rounded once, bit for bit."""
    ws = lam.local_workspaces(world, 1 << 15)
    gen = torch.Generator().manual_seed(world)
    for call in range(4):
        srcs = [torch.randn(shape, generator=gen).to(dtype) for _ in range(world)]
        dsts = [torch.full(shape, float("nan"), dtype=dtype) for _ in range(world)]
        run_call(ws, kind, srcs, dsts)
        want = rank_order_fp32(srcs)
        for r in range(world):
            assert torch.equal(dsts[r], want), (kind, call, r)
            ws[r].raise_on_timeout(f"rank {r}")
    # the epoch advanced once per call in every program that ran, and is the same everywhere
    assert {int(w.epochs[0]) for w in ws} == {4}


def test_bf16_sums_are_the_fp32_sum_within_the_interpreters_rounding():
    """bf16 on the interpreter: its fp32 -> bf16 cast rounds ties away (the GPU rounds them
    to even), so a sum that lands on a tie may differ by one unit in the last place."""
    world, shape = 3, (4, 9)
    ws = lam.local_workspaces(world, 1 << 14)
    srcs = [torch.randn(shape).to(torch.bfloat16) for _ in range(world)]
    for kind in KINDS:
        dsts = [torch.empty(shape, dtype=torch.bfloat16) for _ in range(world)]
        run_call(ws, kind, srcs, dsts)
        exact = sum(s.double() for s in srcs)
        ulp = exact.abs().clamp_min(1e-3) * 2.0**-7
        for d in dsts:
            assert ((d.double() - exact).abs() <= ulp).all(), kind
            assert torch.equal(d, dsts[0])


def test_in_place_calls_reduce_the_buffer_itself():
    world = 2
    ws = lam.local_workspaces(world, 1 << 14)
    for kind in KINDS:
        bufs = [torch.randn(3, 10) for _ in range(world)]
        want = rank_order_fp32(bufs)
        run_call(ws, kind, bufs, bufs)
        assert all(torch.equal(b, want) for b in bufs), kind


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_flag_is_refused_not_read(kind):
    """Three calls use the three slots; the fourth reuses call 1's slot, whose flags still
    hold epoch 1. Rank 1 never pushes in call 4: rank 0 must wait for epoch 4, give up, and
    say so, not sum rank 1's data of call 1 (what a flag that only said "set" would do: the
    result would then be call 1's partial plus rank 0's, with no error)."""
    world, shape = 2, (2, 6)
    ws = lam.local_workspaces(world, 1 << 14, timeout_s=0.5)
    calls = [[torch.full(shape, 10.0 * c + r) for r in range(world)] for c in range(4)]
    for c in range(3):
        dsts = [torch.empty(shape) for _ in range(world)]
        run_call(ws, kind, calls[c], dsts)
        assert all(torch.equal(d, rank_order_fp32(calls[c])) for d in dsts)
    # the stale flag is there: call 1's epoch in rank 0's flag of rank 1's data, slot 1
    row = (lam.slot_of(4) * lam.PHASES_PER_SLOT + 0) * world + 1
    assert lam.slot_of(4) == lam.slot_of(1)
    assert int(ws[0].flags[0][row * lam.MAX_PROGRAMS]) == 1
    dst = torch.full(shape, float("nan"))
    first = lam.phases_of(kind)[0]
    lam.all_reduce(ws[0], kind, calls[3][0], dst, phases=first)  # rank 0 pushes
    with pytest.raises(FlagTimeout, match="timed out after 0.5 s"):
        lam.all_reduce(ws[0], kind, calls[3][0], dst, phases=lam.phases_of(kind)[1])
        ws[0].raise_on_timeout("rank 0")
    # the program went on after giving up (no hang): what it wrote is not to be used, and
    # the status said so; the next check is clean
    ws[0].raise_on_timeout("rank 0")


def test_the_epoch_wraps_to_one_and_the_slot_keeps_cycling():
    assert lam.next_epoch(0) == 1
    last = lam.EPOCH_PERIOD
    assert lam.next_epoch(last) == 1
    assert (lam.slot_of(last), lam.slot_of(1)) == (0, 1)  # ..., 2, 0 then 1: no slot repeats
    seq = [lam.next_epoch(last - 3 + i) for i in range(6)]
    assert len({lam.slot_of(e) for e in seq[:3]}) == 3
    assert len(set(seq)) == 6  # within any window of calls in flight an epoch is unique


def test_bad_calls_are_refused_naming_the_field():
    (w0, _) = lam.local_workspaces(2, 64)
    x = torch.zeros(4, 4)
    with pytest.raises(
        ValueError, match="kind: lamport_one_shot_all_reduce or lamport_two_shot_all_reduce"
    ):
        lam.all_reduce(w0, "three_shot", x, x)
    with pytest.raises(ValueError, match="src, dst: one shape and dtype"):
        lam.all_reduce(w0, LAMPORT_ONE_SHOT, x, torch.zeros(4, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="dst: must be contiguous"):
        lam.all_reduce(w0, LAMPORT_ONE_SHOT, x, torch.zeros(4, 8)[:, :4])
    with pytest.raises(ValueError, match="exceed the workspace's 16"):
        lam.all_reduce(w0, LAMPORT_ONE_SHOT, torch.zeros(17), torch.zeros(17))
    with pytest.raises(ValueError, match="world: 2 .. 8 ranks, got 9"):
        lam.local_workspaces(9, 64)


# --- gemm_ar's lamport schedules: W processes over shared files ------------------------------


def lamport_schedules(p: Problem, **options) -> list[Schedule]:
    space = SpaceOptions(**options)
    return [s for s in enumerate_schedules(p, space) if s.transport in LAMPORT]


def test_each_chunk_gemm_writes_partial_then_the_kernel_reduces_it_into_c():
    p = Problem(pattern="gemm_ar", m=9, n=16, k=8, world=2, dtype="bf16")
    for transport, kind in zip(LAMPORT, KINDS, strict=True):
        plan = build_plan(p, Schedule.parse(f"finer-c2-m/{transport}/cublas"), 0)
        colls = [t.op for t in plan.tasks if isinstance(t.op, CollectiveOp)]
        assert [(c.kind, c.src, c.dst, c.rows) for c in colls] == [
            (kind, "partial", "c", (0, 5)),
            (kind, "partial", "c", (5, 9)),
        ]


@pytest.mark.parametrize(("world", "dtype", "m"), [(2, "fp32", 24), (3, "fp16", 7), (2, "bf16", 1)])
def test_lamport_schedules_verify_over_shared_files(world, dtype, m):
    """Every rank a process running the kernels under the interpreter over shared-file
    scratch and flags; each schedule runs several times (verification and timing rounds)
    on one workspace, so slots are reused across calls and schedules."""
    p = Problem(pattern="gemm_ar", m=m, n=20, k=8, world=world, dtype=dtype)
    schedules = lamport_schedules(p, gemms=(Gemm.CUBLAS,), chunk_counts=(2,))
    assert {s.transport for s in schedules} == set(LAMPORT)
    results = run_problem(p, schedules, backend="cpu")
    assert not [(r.schedule, r.verdict.value, r.detail) for r in results if not r.ok]


def rank0_skips(plan):
    """Rank 0 never launches its all-reduce kernel (its peer waits on its flags)."""
    if plan.rank != 0:
        return plan
    tasks = tuple(t for t in plan.tasks if not isinstance(t.op, CollectiveOp))
    return dataclasses.replace(plan, tasks=tasks)


def test_a_rank_that_skips_its_kernel_is_a_timeout_not_a_hang():
    p = Problem(pattern="gemm_ar", m=8, n=16, k=8, world=2, dtype="fp32")
    (result,) = run_problem(
        p,
        [Schedule.parse("serial/lamport1/cublas")],
        options=RunOptions(timeout_s=8.0),  # flag waits give up after a quarter: 2 s
        backend="cpu",
        plan_hook=rank0_skips,
    )
    assert result.verdict is not Verdict.OK, result


def test_the_kernels_compile_for_sm90_with_system_scope_flags():
    """The GPU code (never run by the interpreter) lowers to cubins for sm_90, each kernel
    with its acquire loads and release stores of the flags at system scope."""
    from offline_sm90 import offline_compile

    flags = offline_compile("compile_lamport_sm90.py")["flags"]
    norms = {"rms_norm_fp8", "rms_norm_two_shot", "rms_norm_two_shot_fp8"}
    assert set(flags) == {"one_shot", "two_shot", *norms}
    for found in flags.values():
        assert {"ld.acquire.sys.global.b32", "st.release.sys.global.b32"} <= set(found), flags
