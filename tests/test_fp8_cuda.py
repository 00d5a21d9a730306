"""Scaled (fp8) plans on the CUDA backends, without a GPU: which buffers are fp8 and which
scales peers read, the scales a schedule must move being re-poisoned before it runs, and the
scaled primitives' moves (``ficco.execute.cuda_scaled``) run unbound on CPU tensors, with
``torch.distributed`` replaced by a loopback: copy-engine and segment pulls carry the rows'
scales, collectives and NCCL moves send fp8 as bytes with the scales as fp32, gloo sends a
row and its scale in one packed message. e5m2 is refused on GPUs, naming why."""

import types

import pytest
import torch

from ficco.execute import cuda_scaled
from ficco.execute.backend import Buffers
from ficco.execute.buffers import view
from ficco.execute.cuda_scaled import ScaledPrimitives
from ficco.execute.cuda_shared import IpcHandle
from ficco.execute.measure import poison
from ficco.execute.scaled import allocate_scaled, row_scales, scale_name
from ficco.kernels import scaled_mm
from ficco.plan import CollectiveOp, TransferGroupOp, TransferOp, build_plan
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.validate import InputError


def fp8(pattern="ag_gemm", world=2, a_scale="row", b_scale="column", **kw) -> Problem:
    if pattern in ("a2a_gemm", "gemm_a2a"):
        kw.setdefault("experts", 2 * world)
    return Problem(pattern=pattern, m=32 * world, n=64, k=64, world=world, dtype="fp8_e4m3",
                   a_scale=a_scale, b_scale=b_scale, **kw)  # fmt: skip


def test_peers_read_a_peer_visible_buffers_row_scales_and_no_other_scale():
    for a_scale, want in (("row", {"a_shard", "a_shard.scale"}), ("tensor", {"a_shard"})):
        made = {}

        def peer_visible(shape, dtype, device, name, made=made):
            made[name] = dtype
            return torch.empty(shape, dtype=dtype, device=device)

        plan = build_plan(fp8(a_scale=a_scale), Schedule(), 0)
        tensors = allocate_scaled(plan, 0, peer_visible_empty=peer_visible)
        assert set(made) == want
        assert made["a_shard"] is torch.float8_e4m3fn
        assert made.get("a_shard.scale", torch.float32) is torch.float32
        # the input's scales were written into the peer-visible allocation
        assert torch.isfinite(tensors[scale_name("a_shard")]).all()


def test_a_schedule_starts_with_the_row_scales_it_must_move_poisoned():
    p = fp8(a_scale="row")
    plan = build_plan(p, Schedule(), 0)
    bufs = Buffers(allocate_scaled(plan, 0))
    t = bufs.tensors
    t[scale_name("a_full")].fill_(1.0)  # what an earlier schedule left
    t["a_full"].view(torch.uint8).zero_()
    shard_scales = t[scale_name("a_shard")].clone()
    poison(plan, bufs)
    assert t[scale_name("a_full")].isnan().all() and t["a_full"].float().isnan().all()
    assert torch.equal(t[scale_name("a_shard")], shard_scales)  # inputs stay
    # a per-tensor scale is static: it stays set
    q = fp8(a_scale="tensor")
    plan = build_plan(q, Schedule(), 0)
    bufs = Buffers(allocate_scaled(plan, 0))
    static = bufs.tensors[scale_name("a_full")].clone()
    poison(plan, bufs)
    assert torch.isfinite(static).all() and torch.equal(bufs.tensors[scale_name("a_full")], static)


def test_the_plans_gemm_reads_no_scale_values_on_the_host():
    p = fp8(a_scale="row")
    from ficco.execute.scaled import quantize

    a, sa = quantize(p, "a", torch.randn(4, 16))
    b, sb = quantize(p, "b", torch.randn(16, 16))
    sa[0] = float("nan")  # a scale still on its way (a workspace's, before its rows land)
    with pytest.raises(InputError, match="finite and positive"):
        scaled_mm.scaled_matmul(a, b, sa, sb)
    out = scaled_mm.scaled_matmul(a, b, sa, sb, check_values=False)
    assert out[0].isnan().all() and torch.isfinite(out[1:]).all()
    with pytest.raises(InputError, match="one per row"):  # shapes are still checked
        scaled_mm.scaled_matmul(a, b, sa[:2], sb, check_values=False)


def test_e5m2_is_refused_on_gpus_naming_cublaslt(monkeypatch):
    monkeypatch.setattr(scaled_mm, "device_capability", lambda device: (9, 0))
    assert scaled_mm.gpu_refusal("fp8_e4m3", "cuda:0") is None
    reason = scaled_mm.gpu_refusal("fp8_e5m2", "cuda:0")
    assert reason and "e5m2 x" in reason and "_scaled_mm" in reason and "fp8_e4m3" in reason


@pytest.mark.parametrize(("rows", "start"), [(1, 3), (2, 2), (6, 0), (4, 1), (4, 4), (12, 8)])
def test_a_row_wise_gemm_gets_the_scale_alignment_cublaslt_takes(rows, start):
    p = fp8(a_scale="row")
    from ficco.execute.scaled import quantize

    a_all, sa_all = quantize(p, "a", torch.randn(32, 64))
    b, sb = quantize(p, "b", torch.randn(64, 32))
    a, sa = a_all[start : start + rows], sa_all[start : start + rows]
    psa, psb = scaled_mm.aligned_scales(sa, sb)
    assert psa.data_ptr() % scaled_mm.SCALE_ALIGN == 0 and psb.data_ptr() % 16 == 0
    assert psa.is_contiguous() and torch.equal(psa, sa) and psb.shape == sb.shape
    assert (psa.data_ptr() == sa.data_ptr()) is (sa.data_ptr() % 16 == 0)  # copied if needed
    assert torch.equal(
        scaled_mm.scaled_matmul(a, b, psa, psb), scaled_mm.scaled_matmul(a, b, sa, sb)
    )
    column = torch.ones(rows, 2)[:, :1]  # a strided view: copied to contiguous storage
    assert scaled_mm.aligned_scales(column, sb)[0].is_contiguous()


# --- the scaled primitives' moves, unbound, on two ranks' CPU tensors ----------------------


def two_ranks(problem: Problem, schedule: Schedule, peer_visible=("a_shard", "x")):
    """Rank 0's primitives state: its plan, its tensors, and IPC-style handles over both
    ranks' peer-visible buffers and their scales (CPU tensors stand in)."""
    plans = [build_plan(problem, schedule, r) for r in range(problem.world)]
    tensors = [allocate_scaled(plan, 7) for plan in plans]
    names = [n for n in peer_visible if n in tensors[0]]
    names += [scale_name(n) for n in names]
    pads = [torch.zeros(8, dtype=torch.int32) for _ in tensors]
    handles = {n: IpcHandle(0, problem.world, [t[n] for t in tensors], pads) for n in names}
    prims = types.SimpleNamespace(
        plan=plans[0],
        bufs=Buffers(tensors[0], handles=handles),
        view=lambda region: view(tensors[0], region),
    )
    methods = ("row_scales", "peer_row_scales", "_pull_scales", "move_beside_segments")
    for method in (*methods, "nccl_bytes_batch", "gloo_packed_batch"):
        setattr(prims, method, getattr(ScaledPrimitives, method).__get__(prims))
    return prims, tensors


def test_a_copy_engine_pull_carries_the_rows_scales():
    p = fp8()
    prims, tensors = two_ranks(p, Schedule.parse("finer-c2-m/ce/cublas"))
    pulls = [t.op for t in prims.plan.tasks if isinstance(t.op, TransferOp)]
    pulls = [op for op in pulls if op.direction == "recv" and op.initiator == "receiver"]
    assert pulls
    for op in pulls:
        prims._pull_scales(op)
        got = row_scales(p, tensors[0], op.local)
        want = tensors[op.peer][scale_name("a_shard")][op.remote.rows[0] : op.remote.rows[1]]
        assert torch.isfinite(got).all() and torch.equal(got, want)


def test_a_segment_group_moves_its_rows_scales_beside_the_kernel():
    p = fp8("a2a_gemm")
    prims, tensors = two_ranks(p, Schedule.parse("serial/seg/cublas"))
    groups = [t.op for t in prims.plan.tasks if isinstance(t.op, TransferGroupOp)]
    assert groups and any(g.transfers for g in groups) and any(g.copies for g in groups)
    assert tensors[0][scale_name("x_recv")].isnan().all()
    for g in groups:
        prims.move_beside_segments(g)
    scales = tensors[0][scale_name("x_recv")]
    assert torch.isfinite(scales).all()  # every row that arrives, its scale too
    local = [c for g in groups for c in g.copies]
    for c in local:
        src = tensors[0][scale_name("x")][c.src.rows[0] : c.src.rows[1]]
        assert torch.equal(scales[c.dst.rows[0] : c.dst.rows[1]], src)


class Loopback:
    """``torch.distributed`` for one rank that receives what it sends (per tag and peer, in
    order), recording every tensor it moves."""

    def __init__(self, world: int) -> None:
        self.world, self.moved, self.queue = world, [], []

    def done(self):
        return types.SimpleNamespace(wait=lambda: None)

    def all_gather_into_tensor(self, out, inp, group=None):
        self.moved.append(inp.dtype)
        out.copy_(torch.cat([inp] * self.world))

    def all_to_all_single(self, out, inp, out_splits, in_splits, group=None):
        self.moved.append(inp.dtype)
        out.copy_(inp)  # splits are symmetric at this problem

    def isend(self, t, peer, group=None, tag=0):
        self.moved.append((t.dtype, tuple(t.shape)))
        self.queue.append(t.clone())
        return self.done()

    def irecv(self, t, peer, group=None, tag=0):
        def land():
            t.copy_(self.queue.pop(0))

        return types.SimpleNamespace(wait=land)

    def P2POp(self, fn, t, peer, group=None):  # noqa: N802 - torch's name
        return types.SimpleNamespace(fn=fn, tensor=t, peer=peer)

    def batch_isend_irecv(self, ops):
        sends = [op for op in ops if op.fn == self.isend]
        for op in sends:
            self.isend(op.tensor, op.peer)
        return [self.irecv(op.tensor, op.peer) for op in ops if op.fn == self.irecv]


@pytest.fixture
def loopback(monkeypatch):
    import torch.distributed as dist

    fake = Loopback(2)
    for name in ("all_gather_into_tensor", "all_to_all_single", "isend", "irecv", "P2POp",
                 "batch_isend_irecv"):  # fmt: skip
        monkeypatch.setattr(dist, name, getattr(fake, name))
    return fake


@pytest.mark.parametrize("pattern", ["ag_gemm", "a2a_gemm"])
def test_a_collective_moves_fp8_as_bytes_and_the_scales_as_fp32(pattern, loopback):
    p = fp8(pattern)
    prims, tensors = two_ranks(p, Schedule())
    prims.group = None
    (op,) = [t.op for t in prims.plan.tasks if isinstance(t.op, CollectiveOp)]
    ScaledPrimitives.collective(prims, op)
    assert loopback.moved == [torch.uint8, torch.float32]
    src, dst = tensors[0][op.src], tensors[0][op.dst]
    reps = dst.shape[0] // src.shape[0]
    assert torch.equal(dst.view(torch.uint8), torch.cat([src.view(torch.uint8)] * reps))
    want = torch.cat([tensors[0][scale_name(op.src)]] * reps)
    assert torch.equal(tensors[0][scale_name(op.dst)], want)


def _transfers(prims):
    return [t.op for t in prims.plan.tasks if isinstance(t.op, TransferOp)]


def test_nccl_moves_fp8_rows_as_bytes_then_their_scales(loopback):
    p = fp8()
    prims, tensors = two_ranks(p, Schedule.parse("shard/nccl/cublas"))
    prims.group, prims.ctx = None, types.SimpleNamespace(shares_gpu=False)
    batch = _transfers(prims)
    assert {t.direction for t in batch} == {"send", "recv"}
    ScaledPrimitives._nccl_batch(prims, batch)
    rows = p.m // p.world
    assert loopback.moved == [(torch.uint8, (rows, p.k)), (torch.float32, (rows, 1))]
    (recv,) = [t for t in batch if t.direction == "recv"]
    got = view(tensors[0], recv.local)
    assert torch.equal(got.view(torch.uint8), tensors[0]["a_shard"].view(torch.uint8))
    assert torch.equal(row_scales(p, tensors[0], recv.local), tensors[0]["a_shard.scale"])


def test_gloo_sends_a_row_and_its_scale_in_one_packed_message(loopback):
    p = fp8()
    prims, tensors = two_ranks(p, Schedule.parse("shard/nccl/cublas"))
    prims.group, prims.run, prims.ctx = None, 1, types.SimpleNamespace(shares_gpu=True)
    batch = _transfers(prims)
    ScaledPrimitives._nccl_batch(prims, batch)
    rows = p.m // p.world
    assert loopback.moved == [(torch.uint8, (rows, p.k + 4))]  # k fp8 bytes + a 4-byte scale
    (recv,) = [t for t in batch if t.direction == "recv"]
    got = view(tensors[0], recv.local)
    assert torch.equal(got.view(torch.uint8), tensors[0]["a_shard"].view(torch.uint8))
    assert torch.equal(row_scales(p, tensors[0], recv.local), tensors[0]["a_shard.scale"])


def test_the_scaled_primitives_come_before_the_executors_own():
    from ficco.execute.cuda import CudaPrimitives
    from ficco.execute.cuda_scaled import scaled_primitives
    from ficco.execute.cuda_shared import SharedPrimitives

    for base in (CudaPrimitives, SharedPrimitives):
        cls = scaled_primitives(base)
        assert cls.__mro__[1:3] == (ScaledPrimitives, base) and scaled_primitives(base) is cls
        for method in ("gemm", "local_copy", "collective", "_ce_transfer", "_nccl_batch"):
            assert getattr(cls, method) is getattr(ScaledPrimitives, method)


def test_a_chunk_gemm_never_reads_scale_values_on_the_host(monkeypatch):
    from ficco.space import Gemm

    cublas = cuda_scaled.chunk_matmul(Gemm.CUBLAS, 100)
    assert cublas.func is scaled_mm.scaled_matmul and cublas.keywords == {"check_values": False}

    def kernel(*args, **kwargs):  # ficco.kernels.scaled.scaled_matmul stands here
        raise AssertionError("not called")

    monkeypatch.setattr(cuda_scaled, "triton_scaled_matmul", lambda: kernel)
    triton = cuda_scaled.chunk_matmul(Gemm.TRITON, 100)
    assert triton.func is kernel and triton.keywords == {"sm_budget": 100, "check_values": False}


def test_a_triton_schedule_without_the_fp8_kernel_is_unavailable_naming_why(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_scaled(name, *args, **kwargs):
        if name == "ficco.kernels.scaled":
            raise ImportError("No module named 'ficco.kernels.scaled'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_scaled)
    from ficco.verdict import Unavailable

    with pytest.raises(Unavailable, match="Triton FP8 GEMM"):
        cuda_scaled.triton_scaled_matmul()


def test_ranks_sharing_a_gpu_record_the_serial_baselines_unavailable_where_the_plan_is():
    """An fp8_e5m2 problem's serial plan cannot run on a GPU: its baselines say why, rather
    than the problem's set-up failing."""
    from ficco.execute.cuda_shared import CudaSharedBackend
    from ficco.verdict import Unavailable

    p = Problem(pattern="ag_gemm", m=64, n=64, k=64, world=2, dtype="fp8_e5m2", a_scale="row")

    def refuse(plan, bufs, run):
        raise Unavailable("dtype fp8_e5m2: no e5m2 x e5m2 GEMM")

    backend = types.SimpleNamespace(rank=0, primitives=refuse)
    bufs = Buffers(allocate_scaled(build_plan(p, Schedule(), 0), 0))
    baselines = CudaSharedBackend.baselines(backend, p, bufs)
    assert {"serial_eager", "gemm_alone", "comm_alone", "async_tp"} <= set(baselines)
    for fn in baselines.values():
        with pytest.raises(Unavailable, match="e5m2 x e5m2|symmetric memory"):
            fn()
