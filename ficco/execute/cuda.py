"""The CUDA backend's primitives: a plan's tasks on one GPU's streams (set-up in
``cuda_setup``; the backend that measures them, its clock included: ``cuda_backend``).

Every task records an event; a task waits only on the events of its own dependencies on
other streams (``compute``, ``comm``, ``signal``: ``ficco.execute.cuda_setup``).

Transports. ``ce``: peer-visible buffers live in PyTorch symmetric memory; a transfer is a
contiguous ``copy_`` between the local tensor and the peer's buffer, a ``cudaMemcpyAsync`` that
the copy engine moves. Gathers pull (one start barrier makes peers' inputs visible); scatters
push into the owner's staging buffer and then ``put_signal``; the owner's ``wait_signal`` on
the signal stream gates the reduction. ``nccl``: each (step, chunk) is one grouped
``batch_isend_irecv`` (both directions in one group, so the ring cannot deadlock); serial
schedules call the collective itself. ``+hi`` schedules use the high-priority NCCL group.
``nccl_ce``: NCCL's zero-CTA copy-engine policy, probed once; where the build or driver
refuses it, its schedules are recorded ``unavailable``. ``symm1``/``symm2`` (gemm_ar):
symmetric memory's all-reduce kernels on the comm stream (``ficco.execute.allreduce``).
``seg`` (all-to-alls): ce's pulls and pushes, a step's as one kernel (``execute.segment``).
``sm`` (relay hops of ag_gemm / gemm_rs): ce's pushes, each moved by a Triton kernel on SMs
(``kernels.reduce.sum_into`` of one input) that stores into the neighbour's buffer.

Traps met on the way: a peer ``copy_`` between two devices in one process makes both current
streams wait on each other (serializes); a strided slice makes ``copy_`` an SM kernel (the
space excludes strided copy-engine chunks); zeros as inputs run faster than random data.

Fused schedules. Every rank has an int32 flag buffer in symmetric memory. ag_gemm: each pull
is followed on the comm stream by ``torch.ops.symm_mem.stream_write_value32_`` on its flag
(the write lands after the copy), and the one fused GEMM on the compute stream spins per tile
on the flags (``ficco.kernels.fused``). gemm_rs: the fused GEMM stores peers' tiles into their
``staging`` and sets their flags; each owner's reduction waits behind a one-program flag wait
on the signal stream. A fused run resets its flags, then meets the peers at the start barrier
before its GEMM starts: no peer writes into a buffer its owner has not released, and no
spinning GEMM can occupy the SMs that the barrier kernel needs. A wait that gives up is read
back after the run (``raise_failures``) as a ``FlagTimeout``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from ficco.defaults import FLAG_SLOTS, FLAG_TIMEOUT_S
from ficco.execute.backend import Buffers
from ficco.execute.cuda_pooling import TritonPooling
from ficco.execute.cuda_setup import RankContext
from ficco.execute.fused import FusedPrimitives
from ficco.execute.interpreter import Primitives
from ficco.execute.segment import SegmentPrimitives
from ficco.patterns.spec import Collective
from ficco.plan import (
    CollectiveOp,
    GemmOp,
    LocalCopyOp,
    Plan,
    ReduceOp,
    SignalOp,
    Stream,
    Task,
    TransferOp,
    WaitFlagsOp,
)
from ficco.plan.ops import GEMM_OPS, PULL, PUSH, Direction, NormOp, Region
from ficco.plan.tags import push_signal_points, signal_channel
from ficco.space import Gemm, Granularity, Priority
from ficco.space.transports import Communicator
from ficco.verdict import Unavailable


class CudaPrimitives(SegmentPrimitives, TritonPooling, FusedPrimitives, Primitives):
    """Streams, events, copy-engine and NCCL transports, cuBLAS / Triton GEMMs and pooling
    for one plan on one rank. Built once per schedule; interpreted many times."""

    def __init__(self, ctx: RankContext, plan: Plan, bufs: Buffers) -> None:
        import torch

        self.ctx, self.plan, self.bufs = ctx, plan, bufs
        s = plan.schedule
        prio = Priority(s.comm_priority)
        self.comm = ctx.comm[prio]
        self.signal_stream = ctx.signal[prio]
        self.transport = s.transport
        traits = s.transport.traits
        self.one_sided = traits.one_sided  # pulls and pushes through symmetric memory
        if traits.communicator is Communicator.NCCL_ZERO_CTA:
            if ctx.nccl_ce_group is None:
                raise Unavailable(ctx.nccl_ce_error or f"{s.transport.value} unavailable")
            self.group = ctx.nccl_ce_group
        else:
            self.group = ctx.group_hi if prio is Priority.HIGH else ctx.group
        pushes = any(t.initiator is PUSH for t in plan.transfers())
        if traits.needs_signals and not ctx.has_signals and pushes:
            raise Unavailable("this torch's symmetric memory has no put_signal/wait_signal")
        from ficco.execute.allreduce import SYMM_KINDS, require_symm_ops

        if traits.all_reduce_kind in SYMM_KINDS:
            require_symm_ops()
        self.sm_budget = max(1, ctx.sm_count - s.sm_reserve)
        self.flag_slots = plan.flag_slots
        self.flag_timeout_s = min(FLAG_TIMEOUT_S, ctx.timeout_s / 4)
        if self.flag_slots:
            if getattr(bufs, "flags", None) is None:
                raise Unavailable("fused schedules need the flag buffer (symmetric memory)")
            if any(isinstance(t.op, SignalOp) for t in plan.tasks) and not hasattr(
                torch.ops.symm_mem, "stream_write_value32_"
            ):
                raise Unavailable("this torch has no torch.ops.symm_mem.stream_write_value32_")
        self.use_triton = s.gemm is Gemm.TRITON
        if self.use_triton:
            from ficco.kernels import matmul as triton_matmul

            self.triton_matmul = triton_matmul
        # keyed by task id (a rewritten plan, as fault injection makes, may skip ids)
        self.events = {task.id: torch.cuda.Event() for task in plan.tasks}
        self.stream_of: dict[int, str | None] = {}
        for task in plan.tasks:
            op = task.op
            if isinstance(op, TransferOp):
                ours = op.initiator is (PULL if op.direction is Direction.RECV else PUSH)
                if self.one_sided and not ours:
                    # push receivers wait on the signal stream; pull senders do nothing
                    self.stream_of[task.id] = "signal" if op.direction is Direction.RECV else None
                else:
                    self.stream_of[task.id] = "comm"
            elif isinstance(op, WaitFlagsOp):
                self.stream_of[task.id] = "signal"  # gates the reductions queued behind it
            elif isinstance(op, ReduceOp) and s.granularity is not Granularity.SERIAL:
                # beside the GEMMs: a chunk's reduction overlaps the next chunk's GEMM, and
                # waits on the same stream as the pushed data it reads
                self.stream_of[task.id] = "signal"
            elif isinstance(op, NormOp) and op.all_reduce is None and len(task.deps) == 1:
                # right behind the task that wrote its rows, on that task's stream
                self.stream_of[task.id] = self.stream_of[task.deps[0]] or "compute"
            else:
                self.stream_of[task.id] = "comm" if task.stream is Stream.COMM else "compute"
        # NCCL: group consecutive transfers that share a tag into one batch (both halves of a
        # step go together, so no rank can block its peer's matching operation).
        self.batches: dict[int, list[int]] = {}
        if traits.batches_pairs:
            lead, lead_tag = None, None
            for task in plan.tasks:
                if isinstance(task.op, TransferOp):
                    if (
                        lead is not None
                        and lead_tag == task.op.tag
                        and lead + len(self.batches[lead]) == task.id
                    ):
                        self.batches[lead].append(task.id)
                        continue
                    lead, lead_tag = task.id, task.op.tag
                    self.batches[lead] = [task.id]
                else:
                    lead = None
        self.channel_of: dict[int, int] = {}
        if self.one_sided:
            # a channel per (step, chunk) so signals of different chunks never alias
            tags = {t.tag for t in plan.transfers()}  # a seg group's members too
            self.channel_of = {tag: signal_channel(tag, s.chunks) for tag in tags}
            self.signalled, self.awaited = push_signal_points(plan)
        self.streams: dict = {}

    # --- walking the plan ---
    def lane(self, task: Task) -> str | None:
        return self.stream_of[task.id]

    def batch(self, task: Task) -> Sequence[int] | None:
        if isinstance(task.op, TransferOp) and self.transport.traits.batches_pairs:
            return self.batches.get(task.id)  # None: issued with its batch leader
        return (task.id,)

    def begin(self, mode: str) -> None:
        import torch

        compute = torch.cuda.current_stream()
        self.streams = {"compute": compute, "comm": self.comm, "signal": self.signal_stream}
        self.prepare_segments()  # seg: built and compiled before the ranks meet
        if self.flag_slots:
            self.prepare_fused()  # compiled before the ranks meet (a no-op after the first)
            # outside a full run nothing sets the flags: preset them as arrived
            self.bufs.flags[: self.flag_slots].fill_(0 if mode == "full" else 1)
        self.comm.wait_stream(compute)
        self.signal_stream.wait_stream(compute)
        if self.one_sided and mode != "gemm":
            # all ranks are past their previous use of peer-visible buffers and have written
            # their inputs before anyone reads or writes a peer's buffer
            with torch.cuda.stream(self.comm):
                self.ctx.fence.barrier(channel=1)
            self.signal_stream.wait_stream(self.comm)
            if self.flag_slots:
                # a fused GEMM starts after the barrier: it writes into peers (gemm_rs), and
                # its spinning programs must not hold the SMs the barrier kernel needs
                compute.wait_stream(self.comm)

    def wait(self, lane: str, deps: Sequence[int]) -> None:
        stream = self.streams[lane]
        for dep in deps:
            if dep in self.events and self.stream_of[dep] != lane:
                stream.wait_event(self.events[dep])

    @contextlib.contextmanager
    def span(self, lane: str, task: Task, kind: str, trace: list | None) -> Iterator[None]:
        import torch

        stream = self.streams[lane]
        with torch.cuda.stream(stream):
            if trace is not None:
                start = torch.cuda.Event(enable_timing=True)
                start.record(stream)
            yield
            if trace is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record(stream)
                trace.append((task.id, kind, start, end, lane))

    def complete(self, lane: str, ids: Sequence[int]) -> None:
        for i in ids:
            self.events[i].record(self.streams[lane])

    def end(self) -> None:
        # join both side streams (they were forked in begin; a graph capture needs every fork
        # joined back)
        compute = self.streams["compute"]
        compute.wait_stream(self.comm)
        compute.wait_stream(self.signal_stream)

    def span_kind(self, task: Task) -> str:
        """'gemm', 'comm', or 'wait': a pushed-to receiver's wait for the sender's signal,
        whose span is the peer's progress (its GEMM chunk, its copy), not work of this rank."""
        op = task.op
        if (
            isinstance(op, TransferOp)
            and self.one_sided
            and op.direction is Direction.RECV
            and op.initiator is PUSH
        ) or isinstance(op, WaitFlagsOp):
            return "wait"
        return "gemm" if isinstance(op, GEMM_OPS) else "comm"

    # --- the ops ---
    def view(self, region):
        from ficco.execute.buffers import view

        return view(self.bufs.tensors, region)

    def peer_view(self, name: str, peer: int, region):
        from ficco.execute.buffers import peer_shape

        t = self.bufs.tensors[name]
        # the peer's own shape: ranks' shares of rows may differ (emb_a2a's uneven batch)
        shape = peer_shape(self.plan.problem, self.plan.rank, peer, name, tuple(t.shape))
        whole = self.bufs.handles[name].get_buffer(peer, shape, t.dtype)
        if region.index is not None:
            whole = whole[region.index]
        return whole[region.rows[0] : region.rows[1], region.cols[0] : region.cols[1]]

    def gemm(self, op: GemmOp) -> None:
        import torch

        a, b, out = self.view(op.a), self.view(op.b), self.view(op.out)
        if self.use_triton:
            self.triton_matmul(a, b, out=out, accumulate=op.accumulate, sm_budget=self.sm_budget)
        elif op.accumulate:
            out.addmm_(a, b)
        elif out.is_contiguous():
            torch.mm(a, b, out=out)
        else:
            out.copy_(a @ b)

    def signal(self, op: SignalOp, deps: Sequence[int]) -> None:
        import torch

        # on the comm stream, behind the copy it follows: the flag says the chunk landed (the
        # op takes a flat uint32 tensor: the int32 flags viewed as such; the kernel reads 1)
        torch.ops.symm_mem.stream_write_value32_(self.bufs.flags.view(torch.uint32), op.slot, 1)

    # --- what the fused primitives need (ficco.execute.fused) ---
    def _local(self, region):
        return self.view(region)

    def _remote(self, region, rank: int):
        return self.peer_view(region.buffer, rank, region)

    def _flag(self, rank: int, slot: int):
        import torch

        flags = self.bufs.flags
        if rank != self.plan.rank:
            flags = self.bufs.flag_handle.get_buffer(rank, (FLAG_SLOTS,), torch.int32)
        return flags[slot : slot + 1]

    def reduce(self, op: ReduceOp) -> None:
        import torch

        from ficco.kernels.reduce import sum_into

        views = [self.view(r) for r in op.inputs]
        out = self.view(op.out)
        if len(views) == 2:
            torch.add(views[0], views[1], out=out)
        elif not sum_into(views, out):  # W > 2: one pass over the inputs where it can
            # a copy even in fp32: the first input may still be on its way to peers (gemm_ar)
            total = views[0].to(torch.float32, copy=True)
            for v in views[1:]:
                total.add_(v)
            out.copy_(total)

    def local_copy(self, op: LocalCopyOp) -> None:
        self.view(op.dst).copy_(self.view(op.src))

    def collective(self, op: CollectiveOp) -> None:
        import torch.distributed as dist

        from ficco.execute.allreduce import cuda_symm_all_reduce

        t = self.bufs.tensors
        if op.kind is Collective.ALL_GATHER:
            dist.all_gather_into_tensor(t[op.dst], t[op.src], group=self.group)
        elif op.kind is Collective.REDUCE_SCATTER:
            dist.reduce_scatter_tensor(t[op.dst], t[op.src], group=self.group)
        elif op.kind is Collective.ALL_TO_ALL:
            dist.all_to_all_single(
                t[op.dst], t[op.src], list(op.recv_rows), list(op.send_rows), group=self.group
            )
        elif op.kind is Collective.ALL_REDUCE:
            # NCCL reduces in place: the partial rectangle into the output, then all_reduce
            # (a strided column chunk goes through a contiguous copy)
            out = self.view(Region(op.dst, op.rows, op.cols))
            out.copy_(self.view(Region(op.src, op.rows, op.cols)))
            flat = out if out.is_contiguous() else out.contiguous()
            dist.all_reduce(flat, group=self.group)
            if flat.data_ptr() != out.data_ptr():
                out.copy_(flat)
        elif op.kind.symmetric_memory or op.kind.lamport:  # all-reduce kernels
            # on the buffers' own group (the one they were rendezvoused on), whatever the
            # schedule's priority: +hi only picks the stream the kernel runs on
            src = self.view(Region(op.src, op.rows, op.cols))
            dst = self.view(Region(op.dst, op.rows, op.cols))
            cuda_symm_all_reduce(op.kind, src, dst, self.ctx.group.group_name)
        else:
            raise ValueError(f"collective: unknown kind {op.kind!r}")

    def norm(self, op: NormOp) -> None:
        from ficco.execute.allreduce import lamport_all_reduce_norm, norm_operands, run_norm

        summed, residual, weight, normed, new_residual, scale = norm_operands(op, self.view)
        if op.all_reduce is None:
            run_norm(summed, residual, weight, op.eps, normed, new_residual, scale)
            return
        # the lamport kernel's fused launch, on the buffers' own group (as the all-reduces)
        group = self.ctx.group.group_name
        lamport_all_reduce_norm(
            op.all_reduce, summed, residual, weight, op.eps, normed, new_residual, group, scale
        )

    def transfer(self, ops: Sequence[TransferOp], task_ids: Sequence[int]) -> None:
        if self.one_sided:
            self._ce_transfer(ops[0])
        else:
            self._nccl_batch(ops)

    def _ce_transfer(self, op: TransferOp) -> None:
        """One side of a copy-engine transfer (the side that acts)."""
        name_remote = op.remote.buffer
        channel = self.channel_of[op.tag]
        if op.direction is Direction.RECV and op.initiator is PULL:  # pull
            self._move(self.view(op.local), self.peer_view(name_remote, op.peer, op.remote))
        elif op.direction is Direction.SEND and op.initiator is PUSH:  # push, then signal
            self._move(self.peer_view(name_remote, op.peer, op.remote), self.view(op.local))
            if op in self.signalled:  # once per (peer, tag): push_signal_points says why
                self.bufs.handles[name_remote].put_signal(op.peer, channel=channel)
        elif op in self.awaited:  # pushed to us: wait for the sender's signal
            self.bufs.handles[op.local.buffer].wait_signal(op.peer, channel=channel)

    def _move(self, dst, src) -> None:
        """A one-sided transfer's bytes: a copy-engine copy, or on a transport off the copy
        engines (sm) a Triton kernel on SMs that stores into ``dst`` (a peer's buffer too)."""
        if not self.transport.traits.copy_engine:
            from ficco.kernels.reduce import sum_into

            if sum_into([src], dst):
                return
        dst.copy_(src)

    def _nccl_batch(self, batch: Sequence[TransferOp]) -> None:
        import torch
        import torch.distributed as dist

        ops = []
        for t in batch:
            local = self.view(t.local)
            if t.direction is Direction.SEND:
                ops.append(
                    dist.P2POp(
                        dist.isend,
                        local.contiguous() if not local.is_contiguous() else local,
                        t.peer,
                        self.group,
                    )
                )
            else:
                buf = (
                    local
                    if local.is_contiguous()
                    else torch.empty_like(local, memory_format=torch.contiguous_format)
                )
                ops.append(dist.P2POp(dist.irecv, buf, t.peer, self.group))
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        for t, p2p in zip(batch, ops, strict=True):
            if (
                t.direction is Direction.RECV
                and p2p.tensor.data_ptr() != self.view(t.local).data_ptr()
            ):
                self.view(t.local).copy_(p2p.tensor)
