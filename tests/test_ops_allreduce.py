"""ficco.ops.matmul_all_reduce on spawned gloo ranks: every kind of gemm_ar schedule, the
fallback where no table covers the pattern, autograd, and a decode-sized M of 1."""

import warnings

import torch
from test_ops import close, gathered, rand, spawn


def ar_reference(a, b, world):
    pairs = zip(gathered(a, world), gathered(b, world), strict=True)
    return sum(p.double() @ q.double() for p, q in pairs)


def _schedules(rank, world, dtype):
    from ficco.ops import matmul_all_reduce
    from ficco.ops.choice import backend_limit
    from ficco.problem import Problem
    from ficco.space import Gemm, SpaceOptions, enumerate_schedules

    M, K, N = 6 * world, 9, 20  # rs_ag schedules need W | M; ragged chunks along m and n
    a, b = rand(40 + rank, M, K, dtype=dtype), rand(50 + rank, K, N, dtype=dtype)
    name = {torch.float32: "fp32", torch.float16: "fp16"}[dtype]
    problem = Problem(pattern="gemm_ar", m=M, n=N, k=K, world=world, dtype=name)
    space = SpaceOptions(chunk_counts=(2, 4), sm_reserves=(0,), gemms=(Gemm.CUBLAS,))
    ran = []
    for schedule in enumerate_schedules(problem, space):
        if backend_limit(problem, schedule, "cpu") is None:
            close(matmul_all_reduce(a, b, schedule=str(schedule)), ar_reference(a, b, world), dtype)
            ran.append(str(schedule))
    # both all-reduce constructions and both splits were among them
    assert any(s.endswith("+rs_ag") for s in ran) and any("-n/" in s for s in ran), ran
    if dtype is torch.float32:  # the symmetric-memory kernels' algorithms (fp32 and bf16 only)
        assert {"/symm1/", "/symm2/"} <= {
            s[s.index("/") : s.index("/", s.index("/") + 1) + 1] for s in ran
        }, ran
    assert len(ran) >= 10, ran


def test_every_cpu_runnable_gemm_ar_schedule_at_w2():
    spawn(_schedules, 2, torch.float32)


def test_gemm_ar_schedules_at_w3_fp16():
    spawn(_schedules, 3, torch.float16)


def _fallback_and_autograd(rank, world):
    from ficco.ops import FallbackWarning, matmul_all_reduce

    for m in (1, 7):  # a decode batch of one token, then an odd one: each call decides anew
        a = rand(60 + rank, m, 8).requires_grad_(True)
        b = rand(70 + rank, 8, 12).requires_grad_(True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c = matmul_all_reduce(a, b, replicated_grad=True)
        close(c.detach(), ar_reference(a.detach(), b.detach(), world))
        if m == 1:  # said once per reason, not once per call
            assert [w.category for w in caught] == [FallbackWarning]
            assert "no table covers gemm_ar" in str(caught[0].message)
        else:
            assert not [w for w in caught if w.category is FallbackWarning]
        probe = rand(80, m, 12)  # the same on every rank, as a replicated activation's gradient
        (c * probe).sum().backward()
        close(a.grad, (probe.double() @ b.detach().double().t()))
        close(b.grad, (a.detach().double().t() @ probe.double()))


def _adjoint(rank, world):
    """Each rank's loss reads only its own rows of c: the gradient needs every rank's
    grad_c (the all-reduce's adjoint), which the identity would miss."""
    import os

    import pytest

    from ficco.ops import linear_all_reduce

    rows = slice(2 * rank, 2 * rank + 2)
    a = rand(100 + rank, 2 * world, 3, 8).requires_grad_(True)  # [M, B, K/W]: leading dims
    weight = rand(110 + rank, 5, 8).requires_grad_(True)  # an nn.Linear's [out, in/W]
    g = rand(120 + rank, 2, 3, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = linear_all_reduce(a, weight)
    (c[rows] * g).sum().backward()
    a_ref, w_ref, g_ref = (
        [t.double().requires_grad_(True) for t in gathered(v.detach(), world)]
        for v in (a, weight, g)
    )
    total = sum(a_ref[r] @ w_ref[r].t() for r in range(world))
    sum((total[2 * r : 2 * r + 2] * g_ref[r]).sum() for r in range(world)).backward()
    close(a.grad, a_ref[rank].grad)
    close(weight.grad, w_ref[rank].grad)
    # the identity (replicated_grad=True) would be wrong here: the debug check says so
    os.environ["FICCO_OPS_CHECK"] = "1"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = linear_all_reduce(a, weight, replicated_grad=True)
        with pytest.raises(ValueError, match="replicated_grad: True asserts every rank's grad_c"):
            (c[rows] * g).sum().backward()
    finally:
        del os.environ["FICCO_OPS_CHECK"]


def _fallback_autograd_adjoint(rank, world):
    _fallback_and_autograd(rank, world)
    _adjoint(rank, world)


def test_table_fallback_and_autograd():
    """The fallback said once; the replicated-gradient backward (asserted); the true adjoint
    by default, against the unsharded model where each rank's loss reads other rows."""
    spawn(_fallback_autograd_adjoint, 2)


def _regroup(rank, world, init_dir):
    import torch.distributed as dist

    from ficco.ops import matmul_all_reduce

    a, b = rand(90 + rank, 4, 8), rand(95 + rank, 8, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        close(matmul_all_reduce(a, b), ar_reference(a, b, world))
        # a new default group, named like the old one: the cached call must not reuse the
        # destroyed group
        dist.destroy_process_group()
        dist.init_process_group(
            "gloo", init_method=f"file://{init_dir}/again", rank=rank, world_size=world
        )
        close(matmul_all_reduce(a, b), ar_reference(a, b, world))
    from ficco.ops.runner import call_plan

    name = dist.group.WORLD.group_name
    assert call_plan("matmul_all_reduce", a, b, name, "", "").group is dist.group.WORLD


def test_a_call_after_the_default_group_is_recreated(tmp_path):
    spawn(_regroup, 2, str(tmp_path))
