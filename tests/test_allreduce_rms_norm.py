"""The all-reduce fused with the residual add and RMSNorm: the kernel's epilogue under the
Triton interpreter (one process playing every rank) against torch's ``rms_norm`` in float64,
the one-shot and two-shot kernels' FP8 output, and the op (``ficco.ops.all_reduce_add_rms_norm``, ``linear_all_reduce(...,
residual=, norm_weight=)``) on a gloo group: values, autograd, torch.compile fullgraph."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import tempfile  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ficco.kernels import allreduce_lamport as lam  # noqa: E402
from ficco.ops.norm import add_rms_norm  # noqa: E402
from ficco.space.transports import LAMPORT_ONE_SHOT as ONE_SHOT  # noqa: E402
from ficco.space.transports import LAMPORT_TWO_SHOT as TWO_SHOT  # noqa: E402

EPS = 1e-5
#: float64 reference vs the kernel: the sum and the new residual are rounded to the dtype once
#: each, the norm once more: a few units in the last place of the dtype
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def run_fused(ws, srcs, residuals, weight, normed, new_residuals, scale=None, kind=ONE_SHOT):
    for phase in lam.phases_of(kind):
        for r, w in enumerate(ws):
            lam.all_reduce_rms_norm(
                w, srcs[r], residuals[r], weight, EPS, normed[r], new_residuals[r], scale, phase,
                kind=kind,
            )  # fmt: skip


def inputs(world, rows, n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    srcs = [torch.randn(rows, n, generator=gen).to(dtype) for _ in range(world)]
    residual = torch.randn(rows, n, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(n, generator=gen)).to(dtype)
    return srcs, residual, weight


@pytest.mark.parametrize(
    ("world", "dtype", "rows", "n"),
    [
        (2, torch.float32, 3, 123),  # odd row length: masked columns stay out of the mean
        (4, torch.float16, 5, 64),
        (8, torch.float32, 1, 40),  # a decode row
        (2, torch.bfloat16, 2, 96),
    ],
)
def test_the_epilogue_is_torchs_rms_norm_of_the_new_residual(world, dtype, rows, n):
    ws = lam.local_workspaces(world, 1 << 15)
    for call in range(4):  # replays on the same workspace, every slot and one reused
        srcs, residual, weight = inputs(world, rows, n, dtype, seed=call)
        normed = [torch.full((rows, n), float("nan"), dtype=dtype) for _ in range(world)]
        new_res = [torch.empty(rows, n, dtype=dtype) for _ in range(world)]
        run_fused(ws, srcs, [residual] * world, weight, normed, new_res)
        exact_res = sum(s.double() for s in srcs) + residual.double()
        tol = TOL[dtype]
        for r in range(world):
            torch.testing.assert_close(new_res[r].double(), exact_res, atol=tol * 8, rtol=tol)
            # the norm alone: torch's rms_norm, float64, of the residual the kernel stored
            want = F.rms_norm(new_res[r].double(), (n,), weight.double(), EPS)
            torch.testing.assert_close(normed[r].double(), want, atol=tol * 4, rtol=tol)
            assert torch.equal(normed[r], normed[0]) and torch.equal(new_res[r], new_res[0])
        if dtype is not torch.bfloat16:  # the interpreter's bf16 rounding differs (ties)
            want_normed, want_res = add_rms_norm(
                sum(s.float() for s in srcs).to(dtype), residual, weight, EPS
            )
            assert torch.equal(new_res[0], want_res)
            torch.testing.assert_close(normed[0], want_normed, atol=tol, rtol=tol)


def test_the_new_residual_may_overwrite_the_residual():
    world, rows, n = 2, 3, 32
    ws = lam.local_workspaces(world, 1 << 14)
    srcs, residual, weight = inputs(world, rows, n, torch.float32)
    want_normed, want_res = add_rms_norm(srcs[0] + srcs[1], residual, weight, EPS)
    residuals = [residual.clone() for _ in range(world)]
    normed = [torch.empty(rows, n) for _ in range(world)]
    run_fused(ws, srcs, residuals, weight, normed, residuals)  # in place, as vLLM's
    for r in range(world):
        assert torch.equal(residuals[r], want_res)
        torch.testing.assert_close(normed[r], want_normed, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("kind", "world", "rows"),
    [(ONE_SHOT, 2, 2), (TWO_SHOT, 2, 3), (TWO_SHOT, 3, 4)],  # two-shot: ragged row slices
)
def test_fp8_output_is_the_normed_value_over_the_scale_saturated(kind, world, rows):
    """Both kernels: ``normed / scale`` saturated at e4m3's 448 and rounded once to the
    nearest e4m3 value (the interpreter's own cast is bypassed: ``_fp8_normed``), every rank
    the same bits (two-shot: the owner's, sent through the scratch)."""
    n = 48
    ws = lam.local_workspaces(world, 1 << 14)
    srcs, residual, weight = inputs(world, rows, n, torch.float32)
    srcs[0][0, 0] = 5000.0  # one value past e4m3's 448 once scaled: saturates
    scale = torch.tensor([0.01])
    normed = [torch.empty(rows, n, dtype=torch.float8_e4m3fn) for _ in range(world)]
    new_res = [torch.empty(rows, n) for _ in range(world)]
    run_fused(ws, srcs, [residual] * world, weight, normed, new_res, scale, kind)
    want, want_res = add_rms_norm(sum(s for s in srcs), residual, weight, EPS, scale)
    exact = F.rms_norm(new_res[0].double(), (n,), weight.double(), EPS) / 0.01
    exact = exact.clamp(-lam.FP8_E4M3_MAX, lam.FP8_E4M3_MAX)
    for r in range(world):
        assert torch.equal(new_res[r], want_res)
        assert torch.equal(normed[r].view(torch.uint8), normed[0].view(torch.uint8))
    got = normed[0].float()
    assert got[0, 0] == lam.FP8_E4M3_MAX
    # e4m3 keeps 3 mantissa bits: within half a step (1/16 relative) of the exact value, or
    # half its subnormal step (2^-10) near zero; fp32's ulps of the norm on top
    err = (got.double() - exact).abs()
    assert (err <= exact.abs() * (1 / 16 + 1e-6) + 2.0**-10).all(), err.max()
    # torch's cast of its own fp32 norm: the same bits but where the two fp32 norms straddle
    # a rounding midpoint (one step apart then)
    differ = got != want.float()
    assert differ.sum() <= 2 and ((got - want.float()).abs()[differ] <= got.abs()[differ] / 8).all()


def test_bad_operands_are_refused_naming_the_field():
    (w0, _) = lam.local_workspaces(2, 1 << 12)
    x = torch.zeros(2, 8)
    ok = dict(residual=x, weight=torch.ones(8), eps=EPS, normed=x.clone(), new_residual=x.clone())
    with pytest.raises(ValueError, match=r"weight: shape \(8,\) expected"):
        lam.all_reduce_rms_norm(w0, x, **{**ok, "weight": torch.ones(9)})
    with pytest.raises(ValueError, match="residual: shape"):
        lam.all_reduce_rms_norm(w0, x, **{**ok, "residual": torch.zeros(3, 8)})
    with pytest.raises(ValueError, match="scale: needed exactly when normed is float8_e4m3fn"):
        lam.all_reduce_rms_norm(w0, x, **{**ok, "normed": x.to(torch.float8_e4m3fn)})


# --- the op on a gloo group ------------------------------------------------------------------


def _op_rank(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from ficco.ops import all_reduce_add_rms_norm, linear_all_reduce

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        n, k, rows = 24, 8, 3
        weights = [torch.randn(n, k, dtype=torch.float64) for _ in range(world)]
        xs = [torch.randn(rows, k, dtype=torch.float64) for _ in range(world)]
        residual = torch.randn(rows, n, dtype=torch.float64)
        norm_w = 1 + 0.1 * torch.randn(n, dtype=torch.float64)
        # reference: the unfused sequence in float64, differentiated by torch
        ref_x = [x.clone().requires_grad_() for x in xs]
        ref_res = residual.clone().requires_grad_()
        ref_w = norm_w.clone().requires_grad_()
        summed = sum(x @ w.t() for x, w in zip(ref_x, weights, strict=True))
        ref_new = summed + ref_res
        ref_normed = F.rms_norm(ref_new, (n,), ref_w, EPS)
        (ref_normed.square().sum() + 0.5 * ref_new.sum()).backward()
        # the op, float32, on this rank's shard
        x = xs[rank].float().requires_grad_()
        res = residual.float().requires_grad_()
        nw = norm_w.float().requires_grad_()
        normed, new_res = linear_all_reduce(
            x, weights[rank].float(), residual=res, norm_weight=nw, eps=EPS
        )
        # every rank's loss is the same function of replicated outputs: replicated_grad
        # would be right too; the default all-reduces grad_s, so divide the loss by W
        ((normed.square().sum() + 0.5 * new_res.sum()) / world).backward()
        got = {
            "normed": (normed.double() - ref_normed).abs().max().item(),
            "new_res": (new_res.double() - ref_new).abs().max().item(),
            "grad_x": (x.grad.double() - ref_x[rank].grad).abs().max().item(),
            "grad_res": (res.grad.double() * world - ref_res.grad).abs().max().item(),
            "grad_w": (nw.grad.double() * world - ref_w.grad).abs().max().item(),
        }
        # torch.compile, fullgraph: the custom op traced whole
        compiled = torch.compile(
            lambda t, r, w: all_reduce_add_rms_norm(t, r, w, eps=EPS), fullgraph=True
        )
        with torch.no_grad():
            part = xs[rank].float() @ weights[rank].float().t()
            c_normed, c_res = compiled(part, residual.float(), norm_w.float())
        got["compiled"] = (c_normed.double() - ref_normed.detach()).abs().max().item()
        got["compiled_res"] = (c_res.double() - ref_new.detach()).abs().max().item()
        errors = [None] * world
        dist.all_gather_object(errors, got)
        if rank == 0:
            torch.save(errors, out)
    finally:
        dist.destroy_process_group()


def test_the_op_matches_the_unfused_sequence_with_gradients_and_compiles(tmp_path):
    world = 2
    init = tempfile.mktemp(dir=tmp_path)
    out = str(tmp_path / "errors.pt")
    mp.start_processes(_op_rank, (world, init, out), nprocs=world, start_method="forkserver")
    for errors in torch.load(out):
        assert all(v < 1e-4 for v in errors.values()), errors


def test_linear_all_reduce_refuses_half_of_the_norm_arguments():
    from ficco.ops import linear_all_reduce

    x, w = torch.zeros(2, 4), torch.zeros(3, 4)
    with pytest.raises(ValueError, match="residual, norm_weight: pass both"):
        linear_all_reduce(x, w, "0", residual=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="schedule, table: not with residual"):
        linear_all_reduce(
            x, w, "0", residual=torch.zeros(2, 3), norm_weight=torch.ones(3), schedule="serial"
        )
