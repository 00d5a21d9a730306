"""emb_a2a: embedding-bag pooling, then the all-to-all of pooled rows (DLRM).

Its problem fields (each bad value refused naming the field and the rule), its bags (the one
seeded definition), its schedule space and rules, its plans (every pooled row written once,
the fused plan's flags agreeing across ranks), its DLRM workloads, ``recommend``'s refusal,
and every distinct plan of the one-GPU lane's problems (``tests/emb_lane.py``) run over
gloo at W = 2 and 3 against the float64 reference, with skewed tables, uneven bags and a
batch W does not divide, beside an even batch and fp16 rows."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import ficco  # noqa: E402
import ficco.api  # noqa: E402
from ficco.execute.run import run_problem  # noqa: E402
from ficco.patterns import emb_a2a as emb  # noqa: E402
from ficco.plan import PoolOp, WaitFlagsOp, build_plan, plan_key  # noqa: E402
from ficco.problem import Problem  # noqa: E402
from ficco.space import (  # noqa: E402
    Compute,
    Gemm,
    Schedule,
    SpaceOptions,
    Transport,
    enumerate_schedules,
    violations,
)
from ficco.space.geometry import geometry  # noqa: E402
from ficco.validate import InputError  # noqa: E402

SKEWED = (50, 7, 300, 20, 9)


def emb_problem(**kw) -> Problem:
    base = dict(pattern="emb_a2a", m=10, n=8, k=3, world=3, tables=SKEWED, dtype="fp32")
    return Problem(**{**base, **kw})


# --- the problem --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field", "rule"),
    [
        ({"tables": None}, "tables", "needs the rows of each table"),
        ({"tables": (5, 6)}, "tables", "needs >= world=3 tables"),
        ({"tables": (5, 0, 6)}, "tables", "every table needs >= 1 row"),
        ({"tables": (5, 6.0, 7)}, "tables", "must be an integer"),
        ({"m": 2}, "m", "the batch must be >= world=3"),
        ({"pooling": "max"}, "pooling", "must be one of sum, mean"),
        ({"bags": "zipf"}, "bags", "fixed, uniform, or one size per table"),
        ({"bags": (1, 2, 3)}, "bags", "need one per table: 5 tables, 3 sizes"),
        ({"bags": (1, 2, 0, 1, 1)}, "bags", "every bag size must be >= 1"),
        ({"bags": (1, 2, 2, 1, 1)}, "k", "k is the largest of them"),
        ({"experts": 3}, "experts/routing", "only the all-to-all patterns take them, not emb_a2a"),
        ({"top_k": 2}, "top_k", "only the all-to-all patterns take it, not emb_a2a"),
        ({"n": 0}, "n", "must be positive"),
        ({"world": 1}, "world", "at least 2 ranks"),
    ],
)
def test_a_bad_field_is_refused_naming_the_field_and_the_rule(change, field, rule):
    with pytest.raises(InputError, match=rule) as err:
        emb_problem(**change)
    assert err.value.field == field


def test_other_patterns_refuse_the_embedding_fields():
    for fname, value in (("tables", (4, 4)), ("pooling", "sum"), ("bags", "fixed")):
        with pytest.raises(InputError, match="only emb_a2a takes it, not ag_gemm") as err:
            Problem(pattern="ag_gemm", m=8, n=8, k=8, world=2, **{fname: value})
        assert err.value.field == fname
    assert Problem(pattern="ag_gemm", m=8, n=8, k=8, world=2).tables is None


def test_the_problem_round_trips_and_its_key_holds_every_field():
    p = emb_problem(pooling="mean", bags=(3, 1, 2, 3, 1), name="x")
    assert (p.pooling, p.bags) == ("mean", (3, 1, 2, 3, 1))
    assert Problem.from_dict(p.to_dict()) == p
    assert p.key == "emb_a2a:m10:n8:k3:w3:fp32:tables50,7,300,20,9:mean:3,1,2,3,1"
    q = emb_problem()
    assert (q.pooling, q.bags) == ("sum", "fixed") and q.key.endswith(":sum:fixed")
    made = ficco.api.make_problem("emb_a2a", m="10", n=8, k=3, world=3, tables="50,7,300,20,9")
    assert made.tables == SKEWED


def test_tables_and_samples_are_dealt_out_whole_and_in_order():
    p = emb_problem()
    assert emb.table_ranges(p) == [(0, 2), (2, 4), (4, 5)]
    assert emb.sample_ranges(p) == [(0, 4), (4, 7), (7, 10)]  # 10 samples over 3: 4, 3, 3
    assert [emb.weight_rows(p, r) for r in range(3)] == [57, 320, 9]
    assert emb.sizes(p) == (20, 320 * 8, (2 + 1) * 4 * 8 * 4, 2 * 4 * 8 * 4, 0)


def test_the_bags_are_the_problems_own_seeded_and_within_their_tables():
    fixed, uniform = emb_problem(bags=(3, 1, 2, 3, 1)), emb_problem(bags="uniform")
    for p in (fixed, uniform):
        for rank, (t0, t1) in enumerate(emb.table_ranges(p)):
            got = emb.lookups(p, rank)
            again = emb.lookups.__wrapped__(p, rank)  # drawn afresh: the same bags
            assert all(torch.equal(got[k], again[k]) for k in got)
            sizes = got["offsets"].diff().view(t1 - t0, p.m)
            first = 0
            for i, t in enumerate(range(t0, t1)):
                lo, hi = int(got["offsets"][i * p.m]), int(got["offsets"][(i + 1) * p.m])
                rows = got["indices"][lo:hi]
                assert first <= int(rows.min()) and int(rows.max()) < first + p.tables[t]
                first += p.tables[t]
                if p is fixed:
                    assert set(sizes[i].tolist()) == {p.bags[t]}
                else:
                    assert int(sizes[i].min()) >= 1 and int(sizes[i].max()) <= 2 * p.k - 1
    sizes = emb.lookups(uniform, 1)["offsets"].diff()
    assert len(set(sizes.tolist())) > 1  # uneven pooling
    assert emb.flops(fixed) == (3 + 1 + 2 + 3 + 1) * 10 * 8


# --- the space and the plans ------------------------------------------------------------------


def test_the_space_has_serial_chunked_and_fused_schedules_on_every_all_to_all_transport():
    every = list(enumerate_schedules(emb_problem()))
    texts = {str(s) for s in every}
    for t in ("nccl", "ce", "seg", "nccl_ce"):
        assert {f"serial/{t}/cublas", f"shard/{t}/cublas", f"finer-c2-m/{t}/cublas+merged"} <= texts
    assert {"finer-c4-m/seg/cublas+all_peers", "finer-c2-m/ce/triton+fused"} <= texts
    fused = [s for s in every if s.compute is Compute.FUSED]
    assert fused and {(s.transport, s.gemm) for s in fused} == {(Transport.CE, Gemm.TRITON)}


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("finer-c2-n/nccl/cublas", "split_applies_to_pattern"),
        ("finer-c2-m/nccl/triton+fused", "fused_needs_symmetric_memory"),
        ("finer-c2-m/ce/cublas+fused", "fused_needs_triton"),
        ("finer-c64-m/ce/cublas", "chunks_fit_extent"),
        ("shard/ce/cublas+rs_ag", "rs_ag_needs_all_reduce"),
    ],
)
def test_each_rule_refusing_an_emb_schedule_says_why(text, rule):
    assert rule in dict(violations(emb_problem(), Schedule.parse(text)))


def test_seg_refuses_rows_that_are_not_whole_16_byte_vectors():
    p = emb_problem(n=6)  # 24-byte rows: blocks start at any row
    assert "transport_needs_aligned_ranges" in dict(
        violations(p, Schedule.parse("serial/seg/cublas"))
    )


def _writes(p: Problem, s: Schedule) -> dict[int, list[int]]:
    """Per rank, how many times each row of its ``y`` is written: by a pool segment of any
    rank, a transfer landing there, a local copy or the collective."""
    counts = {r: [0] * (len(p.tables) * (emb.sample_ranges(p)[r][1] - emb.sample_ranges(p)[r][0]))
              for r in range(p.world)}  # fmt: skip
    for rank in range(p.world):
        plan = build_plan(p, s, rank)
        for task in plan.tasks:
            op = task.op
            if isinstance(op, PoolOp):
                for c in op.chunks:
                    for seg in c.segments:
                        if seg.out.buffer == "y":
                            for row in range(*seg.out.rows):
                                counts[c.out_rank][row] += 1
            elif type(op).__name__ == "TransferOp" and op.direction == "send":
                for row in range(*op.remote.rows):
                    counts[op.peer][row] += 1
            elif type(op).__name__ == "TransferGroupOp":
                for t in op.transfers:
                    for row in range(*t.remote.rows):
                        counts[t.peer][row] += 1
                for cp in op.copies:
                    for row in range(*cp.dst.rows):
                        counts[rank][row] += 1
            elif type(op).__name__ == "LocalCopyOp" and op.dst.buffer == "y":
                for row in range(*op.dst.rows):
                    counts[rank][row] += 1
            elif type(op).__name__ == "CollectiveOp":
                for row in range(len(counts[rank])):
                    counts[rank][row] += 1
    return counts


def test_every_schedule_writes_every_output_row_exactly_once():
    p = emb_problem(world=4, m=9, tables=(5, 60, 7, 8, 90))
    opts = SpaceOptions(chunk_counts=(2, 3, 8), gemms=(Gemm.CUBLAS, Gemm.TRITON))
    seen = set()
    for s in enumerate_schedules(p, opts):
        if plan_key(p, s) in seen:
            continue
        seen.add(plan_key(p, s))
        assert all(c == [1] * len(c) for c in _writes(p, s).values()), str(s)
    assert len(seen) > 30


def test_the_geometry_is_the_plans_on_the_busiest_rank():
    """Largest pooling launch, largest transfer and launch count, as the plans have them (a
    problem whose every block holds at least 4 rows, so every block is cut alike)."""
    p = emb_problem(m=12)
    opts = SpaceOptions(chunk_counts=(2, 4), sm_reserves=(0,))
    checked = 0
    for s in enumerate_schedules(p, opts):
        if not s.overlapped:
            continue
        geo, launches, rows, moved = geometry(p, s), [], [], []
        for rank in range(p.world):
            plan = build_plan(p, s, rank)
            pools = [t.op for t in plan.tasks if isinstance(t.op, PoolOp)]
            launches.append(len(pools))
            rows += [sum(g.out.shape[0] for c in op.chunks for g in c.segments) for op in pools]
            sent: dict[tuple[int, int], int] = {}  # a chunk's runs share its tag
            for t in plan.transfers():
                if t.direction == "send":
                    sent[t.peer, t.tag] = sent.get((t.peer, t.tag), 0) + t.local.shape[0]
            moved += list(sent.values())
            moved += [sum(g.out.shape[0] for g in c.segments) for op in pools
                      for c in op.chunks if c.out_rank != rank]  # fmt: skip
        assert (max(launches), max(rows)) == (geo.gemm_launches, geo.gemm_rows), s
        assert max(moved) == geo.transfer_rows, s  # fused: a chunk stored into a peer
        checked += 1
    assert checked > 20


def test_a_batch_chunk_is_its_samples_of_every_table():
    """Split b: chunk c of a block holds samples [b_c, b_c+1) of every table of the sender, a
    run of rows per table; its pooling writes exactly those bags; ce copies each run, seg
    moves the chunk's runs in one launch, both under the chunk's one tag."""
    from ficco.plan.emb_a2a import chunk_runs
    from ficco.plan.ops import TransferGroupOp

    p = emb_problem()  # rank 0: tables 0-1; rank 1 receives samples 4..6 (3 of them)
    s = Schedule.parse("finer-c2-b/ce/cublas")
    assert chunk_runs(p, s, 0, 1) == [((0, 2), (3, 5)), ((2, 3), (5, 6))]
    assert chunk_runs(p, s, 2, 0) == [((0, 2),), ((2, 4),)]  # one table: one run
    assert chunk_runs(p, Schedule.parse("finer-c2-m/ce/cublas"), 0, 1) == [((0, 3),), ((3, 6),)]
    plan = build_plan(p, s, 0)
    pools = [t for t in plan.tasks if isinstance(t.op, PoolOp) and t.chunk == (1, 0)]
    (seg_a, seg_b) = pools[0].op.chunks[0].segments
    assert (seg_a.bags, seg_b.bags) == ((4, 6), (14, 16))  # bag t*B + b, B = 10: samples 4, 5
    to_peer = [t.op for t in plan.tasks if type(t.op).__name__ == "TransferOp"
               and t.op.direction == "send" and t.op.peer == 1]  # fmt: skip
    assert [op.local.rows for op in to_peer] == [(8, 10), (11, 13), (10, 11), (13, 14)]
    assert len({op.tag for op in to_peer[:2]}) == 1 and to_peer[0].tag != to_peer[2].tag
    grouped = build_plan(p, Schedule.parse("finer-c2-b/seg/cublas"), 0)
    groups = [t.op for t in grouped.tasks if isinstance(t.op, TransferGroupOp)]
    assert [len(g.transfers) for g in groups][:2] == [2, 2]  # one launch per batch chunk
    assert "split_applies_to_pattern" in dict(
        violations(Problem(pattern="ag_gemm", m=8, n=8, k=8, world=2),
                   Schedule.parse("finer-c2-b/ce/cublas"))
    )  # fmt: skip
    assert "chunks_fit_extent" in dict(violations(p, Schedule.parse("finer-c8-b/ce/cublas")))


def test_the_fused_plan_flags_exactly_what_each_rank_waits_for():
    p = emb_problem()
    for text in ("finer-c3-m/ce/triton+fused", "shard/ce/triton+fused+all_peers",
                 "finer-c2-b/ce/triton+fused"):  # fmt: skip
        s = Schedule.parse(text)
        signalled: dict[int, set[int]] = {r: set() for r in range(p.world)}
        waited = {}
        for rank in range(p.world):
            plan = build_plan(p, s, rank)
            (pool,) = [t.op for t in plan.tasks if isinstance(t.op, PoolOp)]
            (wait,) = [t.op for t in plan.tasks if isinstance(t.op, WaitFlagsOp)]
            assert [t.op for t in plan.tasks] == [pool, wait]  # one pooling task, one wait
            assert pool.chunks[-1].out_rank == rank  # peers' chunks first, the local last
            for c in pool.chunks:
                assert (c.signal is None) == (c.out_rank == rank)
                if c.signal is not None:
                    assert c.signal[1] not in signalled[c.signal[0]]
                    signalled[c.signal[0]].add(c.signal[1])
            waited[rank] = set(wait.slots)
        assert signalled == waited, text


# --- workloads, recommend -----------------------------------------------------------------------


def test_the_dlrm_workloads_are_the_published_configurations():
    found = ficco.api.workloads(["dlrm-dcnv2", "dlrm-kaggle"], world=8)
    dcn, kaggle = found.problems
    assert (dcn.pattern, dcn.m, dcn.n, dcn.k, len(dcn.tables)) == ("emb_a2a", 65536, 128, 100, 26)
    assert dcn.tables[0] == 40_000_000 and sum(dcn.bags) == 214
    assert (kaggle.m, kaggle.n, kaggle.k, kaggle.tables[2]) == (128, 16, 1, 10131227)
    assert not found.skipped
    assert all(p.pattern != "emb_a2a" for p in ficco.api.workloads(world=8).problems)
    with pytest.raises(InputError, match="no tables column"):
        ficco.api.workloads(["dlrm-kaggle"], world=2, csv="/tmp/emb-never-written.csv")


def test_the_selector_features_signature_and_ideal_read_the_registry():
    from ficco.export.build import problem_table_features
    from ficco.measure.record import Measurement, signature
    from ficco.select.features import raw_features, roofs_for

    roofs = roofs_for("h200x2")
    for p in (emb_problem(), *ficco.api.workloads(["dlrm-dcnv2"], world=8).problems):
        twin = problem_table_features(p, roofs.to_dict())  # the stdlib twin's sizes
        assert twin[:4] == (0.0,) * 4 and twin[7] == p.m  # no table column for it yet
        with pytest.raises(ValueError, match="emb_a2a has no measured profiles to train on"):
            raw_features(p, roofs)  # the selector refuses it until profiles exist
    m = Measurement(
        problem=emb_problem().to_dict(), name="shard/ce/cublas", median_ms=1.0, samples=3
    )
    sig = signature(m, {"gemm_alone": 0.6, "comm_alone": 0.9})
    assert (sig["ideal_ms"], sig["serial_ms"], sig["chunk_bytes"]) == (0.9, 1.5, 8 * 8 * 4)


def test_recommend_refuses_emb_a2a_until_a_table_measured_it():
    with pytest.raises(ValueError, match="no measured table answers emb_a2a") as err:
        ficco.recommend(emb_problem())
    assert "ficco sweep --backend cuda" in str(err.value)


# --- verification over gloo: every distinct plan, the one-GPU lane's list ------------------


def measurements(problem, schedules):
    """Each schedule's measurement, verified in the session's rank pool of the world
    (tests/conftest.py); a run that failed as a whole is a failure here, with its reason."""
    results = run_problem(problem, schedules, backend="cpu")
    assert all(r.measurement is not None for r in results), [
        (r.schedule, r.detail) for r in results
    ]
    return [r.measurement for r in results]


#: the lane's problems run here at batch 61 (no W divides it) in fp32 rows of 8
ON_CPU = dict(m=61, n=8, dtype="fp32")
#: problems the lane has not, a few schedules each (every plan: the lane's problems): an even
#: batch with per-table bag sizes (sum) over 3 tables; fp16 rows with uniform bags (mean) over
#: one table per rank (Triton's CPU interpreter is refused bf16)
OTHERS = {
    2: [
        Problem(pattern="emb_a2a", m=12, n=8, k=3, world=2, tables=(40, 9, 100),
                bags=(3, 1, 2), dtype="fp32"),
        Problem(pattern="emb_a2a", m=7, n=16, k=4, world=2, tables=(33, 5), bags="uniform",
                pooling="mean", dtype="fp16"),
    ],
    3: [],
}  # fmt: skip
FEW = ("serial/nccl/cublas", "serial/seg/cublas", "shard/ce/cublas", "finer-c2-b/seg/cublas",
       "finer-c2-m/ce/triton+fused")  # fmt: skip


def drop_first_pooled_segment(plan):
    """The first pooling task leaves its first segment's rows unwritten (NaN-poisoned)."""
    import dataclasses

    tasks = list(plan.tasks)
    for i, task in enumerate(tasks):
        if isinstance(task.op, PoolOp):
            first, *rest = task.op.chunks
            first = dataclasses.replace(first, segments=first.segments[1:])
            tasks[i] = dataclasses.replace(
                task, op=dataclasses.replace(task.op, chunks=(first, *rest))
            )
            break
    return dataclasses.replace(plan, tasks=tuple(tasks))


@pytest.mark.parametrize("world", sorted(OTHERS))
def test_every_distinct_plan_of_the_lanes_list_verifies_against_the_float64_reference(world):
    """``tests/emb_lane.py``'s problems, schedule lists and verdict check, as the one-GPU lane
    runs them (``tests/gpu/test_embedding_lane.py``), on the cpu backend, at batch 61 in fp32
    rows of 8 (the lists are asserted the same as the lane's): each list holds every
    (plan, pooling kernel) pair of the space once; each distinct plan runs once here (the cpu
    backend runs the schedules of one plan alike: no streams, no SM grids, torch's pooling
    unless fused), and every one is ok against the float64 reference. Then the problems the
    lane has not (``OTHERS``), and a pooled segment left unwritten, caught. In the session's
    rank pool of the world (tests/conftest.py)."""
    from emb_lane import lane_problems, lane_schedules, verdict_faults

    listed = []
    for on_gpu, problem in zip(lane_problems(world), lane_problems(world, **ON_CPU), strict=True):
        schedules = lane_schedules(problem)
        assert [str(s) for s in schedules] == [str(s) for s in lane_schedules(on_gpu)]
        pairs = [(plan_key(problem, s), s.gemm) for s in schedules]
        every = lane_schedules(problem, every=True)
        assert sorted(map(str, pairs)) == sorted(
            map(str, {(plan_key(problem, s), s.gemm) for s in every})
        )
        once = list({plan_key(problem, s): s for s in reversed(schedules)}.values())[::-1]
        assert any(s.compute is Compute.FUSED for s in once)
        got = measurements(problem, once)
        assert not verdict_faults("cpu", problem, once, got)
        # the check can fail: ranks that share a GPU refuse what ran here
        refused = {str(s) for s in once if s.compute is Compute.FUSED
                   or s.transport is Transport.NCCL_CE}  # fmt: skip
        shared = verdict_faults("cuda_shared", problem, once, got)
        assert refused and {name for name, _, _ in shared} == refused
        listed += [str(s) for s in schedules]
    for problem in OTHERS[world]:
        schedules = [Schedule.parse(t) for t in FEW]
        got = measurements(problem, schedules)
        bad = [(m.name, m.verdict, m.detail) for m in got if m.verdict != "ok"]
        assert len(got) == len(schedules) and not bad, bad
    # the check can fail: a pooled segment left unwritten is caught
    broken = [
        Schedule.parse(t)
        for t in ("shard/ce/cublas", "finer-c2-m/ce/triton+fused", "finer-c2-b/seg/cublas")
    ]
    got = run_problem(
        lane_problems(world, **ON_CPU)[0],
        broken,
        backend="cpu",
        plan_hook=drop_first_pooled_segment,
    )
    assert [r.verdict.value for r in got] == ["incorrect"] * 3, got
    texts = " ".join(listed)
    for part in ("-b/ce/cublas", "-b/ce/triton", "-b/seg/cublas", "-b/seg/triton", "+merged",
                 "+hi", "+sm16", "+sm32", "+fused", "nccl_ce"):  # fmt: skip
        assert part in texts, part
