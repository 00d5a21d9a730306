"""The CUDA backend: plans on GPUs, one process per GPU (set-up in ``cuda_setup``,
the primitives that run a plan's tasks in ``ficco.execute.cuda``).

Buffers: peer-visible ones live in PyTorch symmetric memory (rendezvoused per problem), with
an int32 flag buffer for fused schedules. Baselines: ``ficco.execute.baselines``.

Clock. Before each timed iteration the L2 is flushed (a 256 MiB write) and the ranks meet at
a device-side barrier, so both GPUs start within microseconds; CUDA events around the op.
``queued`` issue never synchronizes the host inside a round (Python's issue cost hides
behind the previous iteration's GPU work and shows only where it exceeds GPU time);
``synced`` waits for the GPU and meets at a host barrier first, so every microsecond of
launch and Python cost between the two events counts.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Sequence

from ficco.defaults import FLAG_SLOTS
from ficco.execute.backend import Backend, Buffers
from ficco.execute.baselines import cuda_baselines
from ficco.execute.cuda import CudaPrimitives
from ficco.execute.cuda_setup import CAPTURE_MODE, RankContext
from ficco.execute.options import TimingOptions
from ficco.patterns import SERIAL_PLAN_PARTS, spec_of
from ficco.plan import Plan, build_plan
from ficco.problem import Problem
from ficco.space import Gemm, Schedule, runs_as_graph


class CudaClock:
    """CUDA events around each iteration, after the L2 flush and the ranks' barriers."""

    def __init__(self, ctx: RankContext, flush_l2: bool) -> None:
        self.ctx, self.flush_l2 = ctx, flush_l2

    def prepare(self, issue: str) -> None:
        import torch
        import torch.distributed as dist

        if self.flush_l2:
            self.ctx.flush.zero_()
        if issue == "synced":
            # an idle GPU and aligned hosts: the op's own issue cost lies between the events
            torch.cuda.synchronize()
            dist.barrier(group=self.ctx.host_group)
        self.ctx.fence.barrier(channel=0)

    def time(self, fn: Callable[[], None]):
        from ficco.execute.timing import device_events

        return device_events(fn)

    def collect(self, pending: dict[str, list]) -> dict[str, list[float]]:
        import torch
        import torch.distributed as dist

        torch.cuda.synchronize()
        names = list(pending)
        if not names:
            return {}
        local = torch.tensor(
            [[s.elapsed_time(e) for s, e in pending[name]] for name in names],
            device=self.ctx.device,
        )
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
        return {name: local[i].tolist() for i, name in enumerate(names)}

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()


class CudaBackend(Backend):
    name = "cuda"
    can_capture = True

    def __init__(self, ctx: RankContext) -> None:
        self.ctx, self.rank, self.world = ctx, ctx.rank, ctx.world
        self.note = f"nccl_ce: {ctx.nccl_ce_error or 'ok'}"

    def allocate(self, problem: Problem, seed: int, schedules: Sequence[Schedule] = ()) -> Buffers:
        """Peer-visible buffers live in symmetric memory (rendezvoused per problem)."""
        import torch
        import torch.distributed._symmetric_memory as symm_mem

        from ficco.execute.buffers import allocate, harness_plan, symmetric_numel
        from ficco.execute.scaled import allocate_scaled

        plan = harness_plan(problem, self.rank, schedules)
        made = {}

        def symm_empty(shape, dtype, device, name=None):  # one size on every rank
            numel = symmetric_numel(problem, name, tuple(shape))
            made[name] = symm_mem.empty(numel, dtype=dtype, device=device)
            return made[name][: torch.Size(shape).numel()].view(shape)

        made_by = allocate_scaled if problem.scaled else allocate
        tensors = made_by(plan, seed, device=self.ctx.device, peer_visible_empty=symm_empty)
        # every peer-visible allocation (a scaled problem's moving row scales too), in order
        group = self.ctx.group.group_name
        handles = {name: symm_mem.rendezvous(whole, group) for name, whole in made.items()}
        # fused schedules' flags: one int32 per (source rank, chunk), set by copies' stream
        # writes or by peers' fused GEMMs
        flags = symm_mem.empty(FLAG_SLOTS, dtype=torch.int32, device=self.ctx.device)
        flags.zero_()
        flag_handle = symm_mem.rendezvous(flags, self.ctx.group.group_name)
        keep = [*made.values(), flags]
        return Buffers(tensors, handles=handles, keep=keep, flags=flags, flag_handle=flag_handle)

    def reference(self, problem: Problem, bufs: Buffers, seed: int):
        from ficco.execute.reference import reference_by_collectives

        return reference_by_collectives(problem, bufs.tensors, self.ctx.device)

    def primitives(self, plan: Plan, bufs: Buffers, run: int) -> CudaPrimitives:
        if plan.problem.scaled:  # fp8 rows with their scales, torch._scaled_mm
            from ficco.execute.cuda_scaled import scaled_primitives

            return scaled_primitives(CudaPrimitives)(self.ctx, plan, bufs)
        return CudaPrimitives(self.ctx, plan, bufs)

    def baselines(self, problem: Problem, bufs: Buffers) -> dict[str, Callable[[], None]]:
        if spec_of(problem.pattern).cuda_baselines == SERIAL_PLAN_PARTS and not problem.scaled:
            # the serial plan (all_to_all_single with splits, one cuBLAS GEMM per expert block)
            # is the eager serial baseline, and its parts the isolated GEMM and collective
            from ficco.execute.baselines import alternative_runs, plan_baselines
            from ficco.execute.buffers import output_of
            from ficco.execute.interpreter import interpret

            def runner(schedule: Schedule):
                plan = build_plan(problem, schedule, self.rank)
                return functools.partial(interpret, self.primitives(plan, bufs, 0))

            output = output_of(build_plan(problem, Schedule(), self.rank), bufs.tensors)
            alternatives = alternative_runs(problem, self.rank, runner)
            return plan_baselines(runner(Schedule()), output, alternatives)
        return cuda_baselines(problem, bufs.tensors, self.ctx.device, self.ctx.group.group_name)

    def floor_machine(self, options: TimingOptions):
        """``options.machine``'s description, else the shipped one of this GPU kind."""
        import torch

        from ficco.measure.floor import machine_for

        chosen = super().floor_machine(options)
        return chosen or machine_for(torch.cuda.get_device_name(self.ctx.device), self.world)

    def clock(self, options: TimingOptions) -> CudaClock:
        return CudaClock(self.ctx, options.flush_l2)

    def gather(self, value):
        import torch.distributed as dist

        out: list = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def all_ranks(self, flag: bool) -> bool:
        import torch
        import torch.distributed as dist

        t = torch.tensor([0.0 if flag else 1.0], device=self.ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item() == 0.0

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def recover(self) -> None:
        import torch

        with contextlib.suppress(Exception):
            torch.cuda.synchronize()

    def wants_graph(self, options: TimingOptions, schedule: Schedule) -> bool:
        """``ficco.space.runs_as_graph`` under ``options.graphs`` (the transport's traits say
        which of its schedules capture)."""
        return runs_as_graph(schedule, options.graphs)

    def capture(self, fn: Callable[[], None]):
        import torch

        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(self.ctx.device)
        side.wait_stream(torch.cuda.current_stream())
        # No garbage collection inside a capture: collecting an earlier problem's buffers
        # frees symmetric memory, which CUDA refuses while a stream captures, and the refusal
        # inside a destructor aborts the process (seen every ~30 problems of a sweep). The
        # worker collects after each problem instead.
        gc.disable()
        try:
            with (
                torch.cuda.stream(side),
                torch.cuda.graph(graph, stream=side, capture_error_mode=CAPTURE_MODE),
            ):
                fn()
        finally:
            gc.enable()
        torch.cuda.current_stream().wait_stream(side)
        return graph

    def pretune(self, problem: Problem, schedules: Sequence[Schedule], report) -> None:
        """Tune the Triton GEMM for every chunk shape before anything overlaps, so tuning
        never times a kernel beside running communication (a cache hit costs nothing)."""
        import torch

        from ficco.problem import torch_dtype

        shapes = set()
        for schedule in schedules:
            # ficco.kernels.scaled (fp8) picks its own configuration
            if schedule.gemm is not Gemm.TRITON or problem.scaled:
                continue
            try:
                plan = build_plan(problem, schedule, self.rank)
            except ValueError:
                continue
            budget = max(1, self.ctx.sm_count - schedule.sm_reserve)
            for op in plan.gemms():
                shapes.add((op.a.shape[0], op.b.shape[1], op.a.shape[1], budget))
        if not shapes:
            return
        from ficco.kernels.tuning import config_for

        for m, n, k, budget in sorted(shapes):
            config_for(m, n, k, torch_dtype(problem.dtype), budget, self.ctx.device)
            report({"phase": "tuned", "name": f"{m}x{n}x{k}@{budget}"})
        torch.cuda.synchronize()

    def signatures(self, results, runners, graphed, options) -> None:
        from ficco.execute.cuda_signatures import signatures

        signatures(self, results, runners, graphed, options)

    def after_problem(self) -> None:
        import torch

        gc.collect()  # free this problem's buffers now, outside any capture
        torch.cuda.empty_cache()

    def close(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()
