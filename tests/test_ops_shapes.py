"""ficco.ops as runtimes call it, on spawned gloo ranks: shards that disagree across ranks
(a ValueError on every rank, the group still usable after it), uneven row shards, leading
dimensions, torch.nn.Linear's [out, in] weights, and which schedule each call ran."""

import pytest
import torch
import torch.distributed as dist
from test_ops import close, rand, spawn


def every_rank(t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``t`` (shapes may differ across ranks)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, t.detach())
    return out


# --- the ranks' agreement ---------------------------------------------------------------------


def _mismatch(rank, world):
    from ficco.ops import all_gather_matmul, matmul_all_reduce, matmul_reduce_scatter

    b = rand(5, 16, 8)
    a_shard = rand(rank, 9 if rank == 0 else 8, 16)  # a 17-token sequence split 9/8
    with pytest.raises(ValueError) as err:
        all_gather_matmul(a_shard, b)
    text = str(err.value)
    assert text.startswith("all_gather_matmul: the ranks' operands disagree"), text
    assert "rank 0: a_shard [9, 16], b [16, 8], float32" in text, text
    assert "rank 1: a_shard [8, 16], b [16, 8], float32" in text, text
    assert "need rows= giving every rank's count (here rows=[9, 8])" in text, text
    assert "table" not in text and "decision" not in text, text
    with pytest.raises(ValueError, match="every rank's b needs the same shape"):
        all_gather_matmul(rand(rank, 4, 16), rand(5, 16, 8 if rank == 0 else 7))  # N differs
    with pytest.raises(ValueError, match=r"rows=\[8, 9\] gives every rank's size"):
        all_gather_matmul(a_shard, b, rows=[8, 9])
    with pytest.raises(ValueError, match="every rank's a needs the same shape"):
        matmul_reduce_scatter(rand(rank, 4 + 2 * rank, 16), b)
    with pytest.raises(ValueError, match="every rank's a needs one dtype"):
        matmul_all_reduce(rand(rank, 4, 16).to([torch.float32, torch.float16][rank]), b)
    with pytest.raises(ValueError, match="the ranks called different ops"):
        (all_gather_matmul if rank == 0 else matmul_reduce_scatter)(rand(rank, 4, 16), b)
    # no rank aborted or hangs: the group still runs agreed calls
    close(
        all_gather_matmul(a_shard, b, rows=[9, 8]),
        torch.cat(every_rank(a_shard)).double() @ b.double(),
    )


# --- uneven shards, leading dimensions --------------------------------------------------------

AG_UNEVEN = (
    None,
    "serial/nccl/cublas",
    "shard/ce/cublas",
    "finer-c2-m/nccl/cublas",
    "finer-c2-k/nccl/cublas",
)
RS_UNEVEN = (None, "serial/nccl/cublas", "shard/nccl/cublas+hi", "finer-c2-m/ce/cublas", "finer-c2-n/nccl/cublas")  # fmt: skip


def _uneven(rank, world, rows):
    from ficco.ops import all_gather_matmul, matmul_reduce_scatter

    K, N, B = 17, 17, 2  # noqa: N806 - K and N split in 2 chunks of 8
    for lead in ((), (B,)):  # [S, K] and [S, B, K] (sequence first, as Megatron's [s, b, h])
        a_shard = rand(rank, rows[rank], *lead, K)
        b = rand(10 + rank, K, N)
        want = torch.cat(every_rank(a_shard)).double() @ b.double()
        for text in AG_UNEVEN:
            close(all_gather_matmul(a_shard, b, rows=rows, schedule=text), want)
        a, w = rand(20 + rank, sum(rows), *lead, K), rand(30 + rank, K, N)
        pairs = zip(every_rank(a), every_rank(w), strict=True)
        total = sum(p.double() @ q.double() for p, q in pairs)
        start = sum(rows[:rank])
        for text in RS_UNEVEN:
            got = matmul_reduce_scatter(a, w, rows=rows, schedule=text)
            want = total[start : start + rows[rank]]
            if want.numel():
                close(got, want)
            assert got.shape == want.shape


def _uneven_w3(rank, world):
    _uneven(rank, world, [3, 2, 2])
    _uneven(rank, world, [1, 3, 0])  # a rank without rows


def test_uneven_shards_every_schedule_kind_at_w3():
    spawn(_uneven_w3, 3)


# --- Linear weights, autograd over uneven 3-D shards, which schedule ran -----------------------


def _linear_mlp(rank, world):
    from ficco.ops import all_gather_linear, linear_reduce_scatter, runner

    rows, B, D, H = [4, 3], 2, 7, 6  # noqa: N806 - a 7-token sequence, uneven over 2 ranks
    x_shard = rand(rank, rows[rank], B, D).requires_grad_()
    w1 = rand(10 + rank, H, D).requires_grad_()  # a column-parallel nn.Linear's [out/W, in]
    w2 = rand(20 + rank, D, H).requires_grad_()  # a row-parallel nn.Linear's [out, in/W]
    bias = rand(40, D).requires_grad_()  # the row-parallel bias, replicated
    g = rand(30 + rank, rows[rank], B, D)
    seen = []
    bind = runner.bind

    def seeing(plan, inputs, like):  # what the plan runs on: the caller's weight, not a copy
        seen.append(inputs["b"].untyped_storage().data_ptr())
        return bind(plan, inputs, like)

    runner.bind = seeing
    h = all_gather_linear(x_shard, w1, rows=rows)  # [7, B, H]
    out = linear_reduce_scatter(torch.tanh(h), w2, bias=bias, rows=rows)
    runner.bind = bind
    assert seen == [w1.untyped_storage().data_ptr(), w2.untyped_storage().data_ptr()]
    assert h.shape == (sum(rows), B, H) and out.shape == (rows[rank], B, D)
    (out * g).sum().backward()
    # the unsharded model in float64, from every rank's tensors
    xs, w1s, w2s = ([t.double().requires_grad_() for t in every_rank(v)] for v in (x_shard, w1, w2))
    bias_ref = bias.detach().double().requires_grad_()
    x = torch.cat(xs)
    total = sum(torch.tanh(x @ w1s[r].t()) @ w2s[r].t() for r in range(world)) + bias_ref
    gs = torch.cat(every_rank(g)).double()
    (total * gs).sum().backward()
    start = sum(rows[:rank])
    close(out.detach(), total[start : start + rows[rank]].detach())
    for got, ref in ((x_shard, xs[rank]), (w1, w1s[rank]), (w2, w2s[rank])):
        close(got.grad, ref.grad)
    bias_grad = bias.grad.clone()
    dist.all_reduce(bias_grad)  # a replicated parameter's gradient: its ranks' parts summed
    close(bias_grad, bias_ref.grad)


def _observed(rank, world):
    import warnings

    from ficco.ops import (
        all_gather_matmul,
        chosen,
        matmul_all_reduce,
        reset_counts,
        schedule_counts,
    )

    reset_counts()
    a_shard, b = rand(rank, 4, 6), rand(5 + rank, 6, 3)
    assert chosen("all_gather_matmul", a_shard[:3], b) is None  # not called yet
    for _ in range(3):
        all_gather_matmul(a_shard, b, schedule="shard/ce/cublas")
    all_gather_matmul(a_shard[:3], b)  # the table's pick
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        matmul_all_reduce(a_shard, b)  # no table covers gemm_ar: serial
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        all_gather_matmul(a_shard, b, schedule="finer-c2-m/nccl/cublas")
    names = {e.name for e in prof.events()}
    assert "ficco::all_gather_matmul:finer-c2-m/nccl/cublas" in names, sorted(names)[:20]
    counts = {(c.op, c.problem.m, str(c.schedule), c.source): c.calls for c in schedule_counts()}
    assert counts[("all_gather_matmul", 8, "shard/ce/cublas", "explicit")] == 3, counts
    assert counts[("all_gather_matmul", 8, "finer-c2-m/nccl/cublas", "explicit")] == 1, counts
    table = [c for c in schedule_counts("all_gather_matmul") if c.problem.m == 6]
    assert len(table) == 1 and table[0].source == "table" and table[0].calls == 1, table
    picked = chosen("all_gather_matmul", a_shard[:3], b)
    assert picked.source == "table" and picked.schedule == table[0].schedule, picked
    assert (
        str(chosen("all_gather_matmul", a_shard, b, schedule="shard/ce/cublas").schedule)
        == "shard/ce/cublas"
    )
    (fallback,) = schedule_counts("matmul_all_reduce")
    assert fallback.source == "fallback" and str(fallback.schedule) == "serial/nccl/cublas"
    assert "no table covers gemm_ar" in fallback.reason


# --- explicit schedules checked against the group's backend ------------------------------------


def _backend_refusals(rank, world):
    from ficco.ops import all_gather_matmul

    a_shard, b = rand(rank, 8, 16), rand(5 + rank, 16, 8)
    with pytest.raises(ValueError, match="cannot run on cpu here: fused schedules need symmetric"):
        all_gather_matmul(a_shard, b, schedule="shard/ce/triton+fused")
    close(all_gather_matmul(a_shard, b), torch.cat(every_rank(a_shard)).double() @ b.double())


def _at_w2(rank, world):
    # one group for every check at W = 2 (a spawn costs seconds; the checks, milliseconds)
    _mismatch(rank, world)
    _uneven(rank, world, [4, 3])
    _linear_mlp(rank, world)
    _observed(rank, world)
    _backend_refusals(rank, world)


def test_mismatches_uneven_shards_linear_weights_counts_and_refusals_at_w2():
    """Mismatched shards raise a ValueError on every rank (the group still runs after it);
    uneven [S, K] and [S, B, K] shards under every kind of schedule; nn.Linear weights
    without a copy, autograd over uneven 3-D shards against the unsharded float64 model; the
    schedule counts and profiler records; a fused schedule refused on a gloo group."""
    spawn(_at_w2, 2)


def test_backend_limits_name_the_reason():
    import ficco
    from ficco.ops import Target, choose
    from ficco.ops.choice import backend_limit

    p = ficco.Problem(pattern="ag_gemm", m=4096, n=1024, k=1024, world=2)
    fused = ficco.Schedule.parse("shard/ce/triton+fused")
    assert "gloo group does not have" in backend_limit(p, fused, "cpu")
    with pytest.raises(ValueError, match="cannot run on cpu here: fused"):
        choose(p, str(fused), "", "cpu")
    ce = ficco.Schedule.parse("shard/ce/cublas")
    assert backend_limit(p, ce, Target("cuda", hosts=1)) is None
    assert "on 2 hosts" in backend_limit(p, ce, Target("cuda", hosts=2))
    assert backend_limit(p, ficco.Schedule.parse("shard/nccl/cublas"), Target("cuda", 2)) is None
    ar = ficco.Problem(pattern="gemm_ar", m=64, n=1024, k=1024, world=2)
    symm = ficco.Schedule.parse("finer-c2-m/symm1/cublas")
    assert "symmetric memory" in backend_limit(ar, symm, Target("cuda", hosts=2))
    assert backend_limit(ar, symm, "cpu") is None  # gloo runs the kernels' algorithms
    # ranks sharing a GPU (cuda tensors on a gloo group): IPC buffers, no symmetric memory
    shared = Target("cuda", shares_gpu=True)
    assert "symmetric memory refuses ranks on one GPU" in backend_limit(ar, symm, shared)
    assert backend_limit(p, ce, shared) is None


def test_disagreement_rules_without_processes():
    from ficco.ops.agree import Signature, disagreement

    def sig(a, b=(16, 8), rows=(), op="all_gather_matmul", dtype=1):
        return Signature(op, a, b, dtype, 0, 0, 0, rows)

    assert disagreement([sig((4, 16)), sig((4, 16))]) is None
    assert disagreement([sig((9, 16), rows=(9, 8)), sig((8, 16), rows=(9, 8))]) is None
    assert "rows=[9, 8]" in disagreement([sig((9, 16)), sig((8, 16))])
    assert "same dimensions after the first" in disagreement([sig((4, 2, 16)), sig((4, 3, 16))])
    assert "one dtype" in disagreement([sig((4, 16)), sig((4, 16), dtype=2)])
    rs = "matmul_reduce_scatter"
    assert "holds all M rows" in disagreement([sig((8, 16), op=rs), sig((6, 16), op=rs)])
    # the wire form carries up to MAX_DIMS dimensions and W counts
    s = sig((3, 2, 5, 16), rows=(3, 4, 1))
    assert Signature.decode(s.encode(3), 3) == s
