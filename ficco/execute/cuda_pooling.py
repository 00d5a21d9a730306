"""Embedding-bag pooling (``PoolOp``, emb_a2a) through ficco's Triton kernel.

A schedule whose compute is Triton (``Gemm.TRITON``) pools with one
:class:`~ficco.kernels.embedding.EmbeddingPool` launch per ``PoolOp``: the op's stacked
``weights``, linearized ``indices`` and ``offsets [T_r * B + 1]`` are one table in the kernel's
terms, each ``PoolSegment`` a segment of it (its bag range into its ``out`` view: this rank's
buffer, or a peer's mapped buffer, so the store is the transfer), and each ``PoolChunk``'s
signal the flag its segments share, set by the chunk's last program with a system-scope
release. The launch is prepared once per op (its tables on the device, so a CUDA graph
captures it) and compiled before the ranks meet. Other schedules pool with torch
(``FusedPrimitives.pool``).

SMs: the launch is not persistent (one program per ``BLOCK_B`` bags, many per SM), so a
schedule's SM reserve (``+smR``) does not bound it; the reserve still sizes the ``seg`` copy
kernel's grid beside it.

The mixin needs from its backend: ``plan``, ``use_triton``, ``_local(region)``,
``_remote(region, rank)``, ``_flag(rank, slot)`` and ``_local_buffer(name)``
(``ficco.execute.fused``).
"""

from __future__ import annotations

from ficco.plan import Plan, PoolOp


class TritonPooling:
    """``pool`` for ``ficco.execute.interpreter`` through the Triton pooling kernel."""

    plan: Plan
    use_triton: bool

    def pool(self, op: PoolOp) -> None:
        if not self.use_triton:
            super().pool(op)  # torch's pooling (FusedPrimitives)
            return
        self._pool_launch(op)()

    def _pool_launch(self, op: PoolOp):
        """The prepared launch of ``op`` (built on first use)."""
        from ficco.kernels.embedding import BagTable, EmbeddingPool, PoolSegmentViews

        # apart from the fused kernels: those report flag timeouts, a pooling launch waits on
        # nothing
        kernels = self.__dict__.setdefault("_pool_launches", {})
        if id(op) in kernels:
            return kernels[id(op)]
        rank = self.plan.rank
        weights = self._local_buffer(op.weights)
        table = BagTable(
            weights,
            self._local_buffer(op.indices),
            self._local_buffer(op.offsets),
            include_last_offset=True,
        )
        segments = []
        for chunk in op.chunks:
            signal = None if chunk.signal is None else self._flag(*chunk.signal)
            for seg in chunk.segments:
                out = (
                    self._local(seg.out)
                    if chunk.out_rank == rank
                    else self._remote(seg.out, chunk.out_rank)
                )
                j0, j1 = seg.bags
                segments.append(PoolSegmentViews(0, j0, j1 - j0, out, signal))
            if signal is not None and not chunk.segments:
                # no rows, but a peer waits on the flag: a segment of zero bags sets it
                segments.append(PoolSegmentViews(0, 0, 0, weights[:0], signal))
        kernels[id(op)] = EmbeddingPool([table], segments, mode=op.mode)
        return kernels[id(op)]

    def prepare_fused(self) -> None:
        """Also build and compile every pooling launch before the ranks meet: a launch
        compiled during the run would spend its peers' flag timeout."""
        if self.use_triton:
            for task in self.plan.tasks:
                if isinstance(task.op, PoolOp):
                    self._pool_launch(task.op).compile()
        super().prepare_fused()
