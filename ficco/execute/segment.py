"""The ``seg`` transport on GPUs: each step's transfers as one segment-copy kernel launch.

A :class:`~ficco.plan.TransferGroupOp` lists the acting halves of one step of an all-to-all
(pulls: the peer's symmetric buffer -> this rank; pushes: this rank -> the peer's buffer) and
the local blocks moved beside them. Its segments become one
:class:`~ficco.kernels.segment_copy.SegmentCopy` over (source view, destination view) pairs,
peer views taken from the symmetric-memory handle as the ``ce`` transport takes them (a
peer's buffer is mapped into this process, so the kernel reaches it by address). The kernel
is built once per op, its table on the device, and launched on the comm stream: a CUDA graph
of the schedule captures the launch as it captures the copy-engine copies. A push group then
signals each peer on the tag's channel (``put_signal``), as a ``ce`` push does, and the
receiver's passive transfer task waits for it on the signal stream.

SM cost. The kernel is an SM copy, not a copy-engine one: its grid is (segments, parts), at
least one program (4 warps, 8 KiB per loop step) per segment, ``parts`` chosen so that
segments x parts is about the program budget and never more than the longest segment's
8 KiB blocks. The budget is the kernel's default (1024 programs, enough to spread a few
segments over every SM) unless the schedule reserves SMs: ``+smR`` leaves R SMs free of the
persistent Triton GEMM, and the copy kernel is then given R programs (one per reserved SM),
so the two share the GPU by partition instead of by the hardware scheduler's interleaving.

The mixin needs from its backend: ``plan``, ``bufs``, ``view(region)``,
``peer_view(name, peer, region)``, ``channel_of`` (tag -> signal channel), ``signalled`` (the
pushes that signal: ``ficco.plan.tags.push_signal_points``) and ``ctx.device``.
"""

from __future__ import annotations

from ficco.plan import Plan, TransferGroupOp
from ficco.plan.ops import Direction


class SegmentPrimitives:
    """``transfer_group`` for ``ficco.execute.interpreter`` on CUDA."""

    plan: Plan
    bufs: object
    channel_of: dict[int, int]

    def view(self, region): ...  # pragma: no cover - supplied by the backend

    def peer_view(self, name: str, peer: int, region): ...  # pragma: no cover

    def _segment_kernels(self) -> dict:
        """id(op) -> its prepared SegmentCopy (kept alive as long as the primitives: a
        captured graph reads the kernel's device table on every replay)."""
        return self.__dict__.setdefault("_seg_kernels", {})

    def segment_pairs(self, op: TransferGroupOp) -> list:
        """The group's (source, destination) tensor pairs: transfers first, then copies."""
        pairs = []
        for t in op.transfers:
            remote = self.peer_view(t.remote.buffer, t.peer, t.remote)
            local = self.view(t.local)
            pairs.append((remote, local) if t.direction is Direction.RECV else (local, remote))
        pairs.extend((self.view(c.src), self.view(c.dst)) for c in op.copies)
        return pairs

    def _segment_kernel(self, op: TransferGroupOp):
        from ficco.kernels.segment_copy import SegmentCopy

        kernels = self._segment_kernels()
        if id(op) not in kernels:
            reserve = self.plan.schedule.sm_reserve
            programs = {"programs": reserve} if reserve else {}
            kernels[id(op)] = SegmentCopy(self.segment_pairs(op), **programs)
        return kernels[id(op)]

    def prepare_segments(self) -> None:
        """Build every group's kernel and compile the kernel now (one launch over a local
        16-byte scratch), before the ranks meet: a compile inside the run would hold up the
        peers that wait on this rank's pushes."""
        groups = [t.op for t in self.plan.tasks if isinstance(t.op, TransferGroupOp)]
        if not groups or self._segment_kernels():
            return
        import torch

        from ficco.kernels.segment_copy import SegmentCopy

        for op in groups:
            self._segment_kernel(op)
        scratch = torch.zeros(2, 16, dtype=torch.uint8, device=self.ctx.device)
        SegmentCopy([(scratch[0], scratch[1])])()

    def move_beside_segments(self, op: TransferGroupOp) -> None:
        """What moves beside the kernel, before a push group's signals (a scaled plan's row
        scales: ``ficco.execute.cuda_scaled``)."""

    def transfer_group(self, op: TransferGroupOp, task_id: int) -> None:
        self._segment_kernel(op)()
        self.move_beside_segments(op)
        for t in op.transfers:
            # a push tells the owner its block landed, once per (peer, tag): a batch chunk
            # pushes a run per table under one tag (ficco.plan.tags.push_signal_points)
            if t.direction is Direction.SEND and t in self.signalled:
                self.bufs.handles[t.remote.buffer].put_signal(
                    t.peer, channel=self.channel_of[t.tag]
                )
