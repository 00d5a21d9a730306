"""The fused-schedule primitives both backends share (``ficco.kernels.fused`` underneath).

A backend mixes :class:`FusedPrimitives` into its primitives and supplies where things are:
``_local(region)`` (a view of this rank's buffer), ``_remote(region, rank)`` (a view of a
peer's peer-visible buffer: symmetric memory on GPUs, a mapped shared file on CPU),
``_flag(rank, slot)`` (a 1-element int32 view of a rank's flag), the Triton program budget
``sm_budget`` and ``flag_timeout_s``. Kernels are prepared once per op (their tables live on
the device, so a CUDA graph can capture the launches) and issued on each run.
"""

from __future__ import annotations

from ficco.plan import FusedGemmOp, Plan, PoolChunk, PoolOp, WaitFlagsOp


class FusedPrimitives:
    """``fused_gemm``, ``pool``, ``wait_flags`` and ``raise_failures`` for
    ``ficco.execute.interpreter``."""

    plan: Plan
    sm_budget: int
    flag_timeout_s: float
    flag_slots: int
    #: the host learns of a kernel's end when the call returns (the CPU interpreter): raise
    #: a timeout at once instead of after the run
    synchronous: bool = False

    def _local(self, region): ...  # pragma: no cover - supplied by the backend

    def _remote(self, region, rank: int): ...  # pragma: no cover

    def _flag(self, rank: int, slot: int): ...  # pragma: no cover

    def _kernels(self) -> dict:
        """id(op) -> its prepared FusedGemm or FlagWait (prepared on first use)."""
        return self.__dict__.setdefault("_fused_kernels", {})

    def _chunk_name(self, slot: int) -> str:
        per_source = max(1, self.flag_slots // self.plan.problem.world)
        return f"source rank {slot // per_source} chunk {slot % per_source} (flag slot {slot})"

    def _kernel(self, op: FusedGemmOp | WaitFlagsOp):
        """The prepared kernel of ``op`` (built on first use)."""
        from ficco.kernels.fused import FlagWait, FusedChunkViews, FusedCopyViews, FusedGemm

        kernels = self._kernels()
        if id(op) in kernels:
            return kernels[id(op)]
        rank = self.plan.rank
        if isinstance(op, WaitFlagsOp):
            kernel = FlagWait(
                [self._flag(rank, s) for s in op.slots],
                [self._chunk_name(s) for s in op.slots],
                timeout_s=self.flag_timeout_s,
            )
        else:

            def out(region, out_rank: int):
                return self._local(region) if out_rank == rank else self._remote(region, out_rank)

            scales = self._scales if self.plan.problem.scaled else (lambda region, side: None)
            chunks = []
            for c in op.chunks:
                chunks.append(
                    FusedChunkViews(
                        self._local(c.a),
                        out(c.out, c.out_rank),
                        None if c.wait is None else self._flag(rank, c.wait),
                        None if c.signal is None else self._flag(*c.signal),
                        "" if c.wait is None else self._chunk_name(c.wait),
                        tuple(
                            FusedCopyViews(
                                out(d.out, d.out_rank),
                                None if d.signal is None else self._flag(*d.signal),
                            )
                            for d in c.copies
                        ),
                        scales(c.a, "a"),
                    )
                )
            kernel = FusedGemm(
                chunks,
                self._local(op.b),
                sm_budget=self.sm_budget,
                timeout_s=self.flag_timeout_s,
                b_scale=scales(op.b, "b"),
            )
        kernels[id(op)] = kernel
        return kernel

    def _scales(self, region, side: str):
        """The fp8 scales of this rank's ``region`` of an ``side`` ('a'/'b') operand: its
        rows' (A per row: they landed with the rows), its columns' (B), or the one scale."""
        from ficco.execute.scaled import operand

        return operand(self._all_buffers(), region, side)[1]

    def _all_buffers(self) -> dict:
        """This rank's tensors by name (the CPU primitives hold ``tensors``, the CUDA ones
        ``bufs.tensors``)."""
        tensors = getattr(self, "tensors", None)
        return self.bufs.tensors if tensors is None else tensors

    def prepare_fused(self) -> None:
        """Build and compile every flag kernel of the plan now, before the ranks meet: a
        kernel compiled during the run would spend its peers' flag timeout."""
        for task in self.plan.tasks:
            if (
                isinstance(task.op, FusedGemmOp | WaitFlagsOp)
                and id(task.op) not in self._kernels()
            ):
                self._kernel(task.op).compile()

    def fused_gemm(self, op: FusedGemmOp) -> None:
        kernel = self._kernel(op)
        kernel()
        if self.synchronous:
            kernel.raise_on_timeout(f"rank {self.plan.rank}: fused GEMM")

    def pool(self, op: PoolOp) -> None:
        """Embedding-bag pooling (emb_a2a): each chunk's segments pooled into their output
        (this rank's buffer, or zero-copy into a peer's), then the chunk's flag set."""
        for chunk in op.chunks:
            self._pool_chunk(op, chunk)
            if chunk.signal is not None:
                self._flag(*chunk.signal).fill_(1)

    def _pool_chunk(self, op: PoolOp, chunk: PoolChunk) -> None:
        """One chunk's segments with torch's EmbeddingBag (``ficco.patterns.emb_a2a.
        embedding_bag``: the serial baseline's pooling); a backend with a pooling kernel
        overrides it."""
        from ficco.execute.buffers import index_input
        from ficco.patterns.emb_a2a import embedding_bag

        weights = self._local_buffer(op.weights)
        indices, offsets = self._local_buffer(op.indices), self._local_buffer(op.offsets)
        rank = self.plan.rank
        # the bags' bounds from the problem's own offsets in host memory (``offsets``' values):
        # reading them from the device would wait for the GPU per segment, and uncapturable
        host = index_input(self.plan.problem, rank, op.offsets)
        for seg in chunk.segments:
            out = (
                self._local(seg.out)
                if chunk.out_rank == rank
                else self._remote(seg.out, chunk.out_rank)
            )
            out.copy_(embedding_bag(weights, indices, offsets, seg.bags, op.mode, host))

    def _local_buffer(self, name: str):
        """This rank's whole buffer ``name``."""
        return self._all_buffers()[name]

    def wait_flags(self, op: WaitFlagsOp) -> None:
        kernel = self._kernel(op)
        kernel()
        if self.synchronous:
            kernel.raise_on_timeout(f"rank {self.plan.rank}: reduction's flag wait")

    def raise_failures(self) -> None:
        for kernel in self._kernels().values():
            kernel.raise_on_timeout(f"rank {self.plan.rank}: fused schedule")
