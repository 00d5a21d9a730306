"""Per-task costs, and a plan lowered to the simulator's tasks.

GEMM: cuBLAS time from a roofline with wave quantization, corrected by the measured GEMMs
nearest in (log m, log n, log k) (inverse-distance weighted log residuals, fading with
distance, so a shape far from every measurement gets the roofline alone). Copies and NCCL:
``fixed + bytes / (efficiency x the link's bandwidth)`` per op class (``params`` module); a
collective is a ring of W - 1 steps over the slowest link it crosses.
Embedding pooling (``PoolOp``): ``fixed + bytes / gather bandwidth`` of the machine
description's ``gather`` entry, the bytes every gathered row (the bags' mean sizes) and every
pooled row written.

Lanes follow the CUDA executor (``ficco.execute.cuda``): copy-engine pulls and pushes on the
comm stream, a pushed-to receiver's wait and the chunked reductions on the signal stream,
GEMMs on the compute stream; NCCL send/recv halves with one tag form one batch.
"""

from __future__ import annotations

import heapq
import math

from ficco.model.fp8 import FP8_TRITON_VS_CUBLAS, fp8_gemm_bytes, fp8_roof_ratio
from ficco.model.machine import Machine
from ficco.model.params import ModelParams
from ficco.model.simulate import SimTask, Slowdowns
from ficco.patterns import ModelSupport, patterns_where, spec_of
from ficco.patterns.emb_a2a import gathered_rows
from ficco.patterns.spec import Collective
from ficco.plan import (
    CollectiveOp,
    GemmOp,
    LocalCopyOp,
    NormOp,
    Plan,
    PoolOp,
    ReduceOp,
    TransferOp,
)
from ficco.plan.ops import PULL, PUSH, Direction
from ficco.space import Gemm, Granularity, Schedule
from ficco.space.transports import CostClass

#: patterns whose ops the model was calibrated on, and those whose ops it reuses (their
#: spec's ``cost_model``)
CALIBRATED_PATTERNS = patterns_where(lambda spec: spec.cost_model is ModelSupport.CALIBRATED)
REUSED_PATTERNS = patterns_where(lambda spec: spec.cost_model is ModelSupport.REUSED)


def reduce_traffic(inputs: int) -> tuple[int, int]:
    """(kernel launches, HBM traffic in units of one chunk of the output dtype) of the CUDA
    executor's reduction of ``inputs`` partials: one add of two; beyond two, an fp32
    accumulator (a cast, one in-place add per further input, a cast back), so W = 4 moves 7x
    the bytes of W = 2 in 5 launches. Since 12017b1 the executor sums up to 8 inputs in one
    pass (``ficco.kernels.reduce``: inputs + 1 units, one launch); the model keeps the traffic
    of the measurements it was evaluated against (the W = 4 suite at 762e560) until that suite
    is measured again with the new reduction."""
    if inputs <= 2:
        return 1, inputs + 1
    # cast: read 1, write 2 (fp32); each add: read 2 + 1, write 2; cast back: read 2, write 1
    return inputs + 1, 3 + 5 * (inputs - 1) + 3


def gemm_roofline_ms(
    params: ModelParams, machine: Machine, m: int, n: int, k: int, fp8_ratio: float = 0.0
) -> float:
    """cuBLAS time before the measured correction: wave-quantized FLOPs against HBM traffic.
    ``fp8_ratio`` (0: a 2-byte GEMM): an FP8 GEMM's speed over bf16 at the roof, its bytes
    FP8's (``ficco.model.fp8``)."""
    g = params.gemm
    tm, tn, sms = g["tile_m"], g["tile_n"], machine.sm_count
    tiles = math.ceil(m / tm) * math.ceil(n / tn)
    waves = math.ceil(tiles / sms)
    compute = waves * sms * tm * tn * k * 2 / g["peak_flops_per_ms"]
    if fp8_ratio:
        compute /= fp8_ratio
        memory = fp8_gemm_bytes(m, n, k) / (machine.hbm_gbs * 1e6 * g["hbm_eff"])
    else:
        memory = (m * k + k * n + m * n) * 2 / (machine.hbm_gbs * 1e6 * g["hbm_eff"])
    p = g["softmax_p"]
    return g["launch_ms"] + (compute**p + memory**p) ** (1 / p)


def gemm_residual(params: ModelParams, m: int, n: int, k: int) -> float:
    """Log correction at (m, n, k) from the measured GEMMs nearest to it."""
    if not params.gemm_residuals:
        return 0.0
    x = (math.log2(m), math.log2(n), math.log2(k))
    # the nearest few (heapq.nsmallest is sorted()[:k], without sorting them all)
    dist = heapq.nsmallest(
        int(params.gemm["idw_neighbors"]),
        ((math.dist(x, r[:3]), r[3]) for r in params.gemm_residuals),
    )
    if dist[0][0] < 1e-9:
        return dist[0][1]
    weights = [1.0 / (d * d + 1e-2) for d, _ in dist]
    mean = sum(w * r for w, (_, r) in zip(weights, dist, strict=True)) / sum(weights)
    return mean * math.exp(-dist[0][0] / params.gemm["idw_decay"])


class CostModel:
    """Task costs for one (machine, parameters) pair; caches GEMM times by shape."""

    def __init__(self, machine: Machine, params: ModelParams) -> None:
        self.machine, self.params = machine, params
        self._gemm_cache: dict[tuple[int, int, int], float] = {}
        self._terms_cache: dict[tuple, float] = {}
        self._link_cache: dict[tuple, tuple[str, float, float]] = {}
        # id(plan), transport, granularity -> (plan, tasks, GEMM positions)
        self._skeletons: dict[tuple, tuple] = {}
        c = params.contention
        # (victim kind, aggressor kind) -> slowdown; SM kernels are GEMMs and reductions
        self.slowdown: Slowdowns = {
            ("sm", "ce"): c["ce_gemm"],
            ("ce", "sm"): c["ce_comm"],
            ("sm", "nccl"): c["nccl_gemm"],
            ("nccl", "sm"): c["nccl_comm"],
        }

    # --- GEMM ---
    def cublas_ms(self, m: int, n: int, k: int, fp8: bool = False) -> float:
        """cuBLAS's time (``fp8``: ``_scaled_mm``'s, from FP8's roof and bytes; the bf16
        shape residuals correct both: ``ficco.model.fp8``)."""
        key = (m, n, k, True) if fp8 else (m, n, k)
        if key not in self._gemm_cache:
            ratio = fp8_roof_ratio(self.machine)[0] if fp8 else 0.0
            base = gemm_roofline_ms(self.params, self.machine, m, n, k, ratio)
            self._gemm_cache[key] = base * math.exp(gemm_residual(self.params, m, n, k))
        return self._gemm_cache[key]

    def gemm_ms(self, schedule: Schedule, m: int, n: int, k: int, fp8: bool = False) -> float:
        t = self.cublas_ms(m, n, k, fp8)
        if schedule.gemm is Gemm.TRITON:
            sms = self.machine.sm_count
            budget = max(1, sms - schedule.sm_reserve)
            g = self.params.gemm
            triton = FP8_TRITON_VS_CUBLAS if fp8 else g["triton_vs_cublas"]
            t *= triton * (sms / budget) ** g["sm_budget_exponent"]
        return t

    # --- data movement ---
    def _work(self, terms: list[tuple[str, float, float]]) -> float:
        tr = self.params.transfer
        return sum(n * tr[f"{c}_fixed_ms"] + sb / tr[f"{c}_eff"] for c, n, sb in terms)

    def _link_term(self, cls: str, nbytes: float, same_node: bool) -> tuple[str, float, float]:
        """(class, 1 fixed cost, bytes over the link's bandwidth) plus the latency a slower
        link adds over the intra-node one (folded into the bytes term at efficiency 1)."""
        link = self.machine.links["nvlink" if same_node else "nic"]
        base = self.machine.links["nvlink"]
        extra_latency = max(0.0, link.latency_us - base.latency_us) / 1e3
        eff = self.params.transfer[f"{cls}_eff"]
        return (cls, 1.0, nbytes / link.bytes_per_ms + extra_latency * eff)

    def _link_term_cached(self, cls: str, nbytes: float, same_node: bool) -> tuple:
        key = (cls, nbytes, same_node)
        term = self._link_cache.get(key)
        if term is None:
            term = self._link_cache[key] = self._link_term(cls, nbytes, same_node)
        return term

    def _hbm_term(self, cls: str, nbytes: float, count: float = 1.0) -> tuple[str, float, float]:
        return (cls, count, nbytes / (self.machine.hbm_gbs * 1e6))

    def collective_terms(
        self, op: CollectiveOp, world: int, total_bytes: float
    ) -> list[tuple[str, float, float]]:
        """A ring collective: one fixed cost (launch and synchronization, calibrated at W = 2)
        and W - 1 steps of a 1/W share each over the slowest link, each step paying that
        link's latency (an all-reduce: a reduce-scatter ring, then an all-gather ring)."""
        link = self.machine.slowest_link(world)
        steps = world - 1
        share = (total_bytes / world) / link.bytes_per_ms
        tr = self.params.transfer

        def ring(kind: str) -> tuple[str, float, float]:
            # the steps' latency rides in the bytes term, at efficiency 1
            latency = steps * link.latency_us / 1e3 * tr[f"{kind}_eff"]
            return (kind, 1.0, steps * share + latency)

        if op.kind is Collective.ALL_GATHER:
            return [ring("all_gather")]
        if op.kind is Collective.REDUCE_SCATTER:
            return [ring("reduce_scatter")]
        if op.kind is Collective.ALL_REDUCE:
            return [ring("reduce_scatter"), ring("all_gather")]
        return [ring("p2p")]

    # --- a plan ---
    def lower(self, plan: Plan, schedule: Schedule | None = None) -> list[SimTask]:
        """The plan as simulator tasks on the executor's lanes, with their costs; each task
        carries when an eager host has issued it (``simulate(..., issue=False)`` ignores it).
        ``schedule`` (default the plan's) sets the GEMM kind and SM reserve costed: the tasks
        are lowered once per plan with cuBLAS GEMMs (cached while the plan lives) and only
        the GEMM tasks' work is recosted for another kind."""
        s = schedule or plan.schedule
        key = (id(plan), s.transport, s.granularity)
        cached = self._skeletons.get(key)
        if cached is None or cached[0] is not plan:
            if len(self._skeletons) > 256:
                self._skeletons.clear()
            cached = (plan, *self._lower_cublas(plan, s))
            self._skeletons[key] = cached
        _, tasks, gemm_at = cached
        if s.gemm is not Gemm.TRITON:
            return list(tasks)
        out = list(tasks)
        work_of: dict[tuple, float] = {}  # a few GEMM shapes, many GEMMs
        for pos, shape in gemm_at:
            work = work_of.get(shape)
            if work is None:
                work = work_of[shape] = self.compute_task_work(s, shape)
            tid, lane, _, kind, deps, issue_ms, terms = out[pos]
            out[pos] = tuple.__new__(SimTask, (tid, lane, work, kind, deps, issue_ms, terms))
        return out

    def _task_work(self, work: float) -> float:
        """A task's work in a timed run: the isolated spans the costs were fitted on carry a
        per-task overhead (the events around each task) that a timed run does not pay."""
        if work > 0:
            return max(work - self.params.host["span_ms"], 0.1 * work)
        return work

    def gemm_task_work(self, schedule: Schedule | None, shape: tuple) -> float:
        """A GEMM task's work: ``schedule``'s GEMM kind and SM reserve (None: cuBLAS);
        ``shape`` is ``(m, n, k)``, or ``(m, n, k, True)`` for an FP8 GEMM."""
        ms = self.cublas_ms(*shape) if schedule is None else self.gemm_ms(schedule, *shape)
        return self._task_work(ms)

    def compute_task_work(self, schedule: Schedule | None, key: tuple) -> float:
        """A compute task's work by its key: a GEMM's ``(m, n, k)`` (FP8: ``(m, n, k,
        True)``), or a pooling launch's
        ``("pool", bytes)``."""
        if key[0] == "pool":
            return self.pool_ms(schedule, key[1])
        return self.gemm_task_work(schedule, key)

    def pool_ms(self, schedule: Schedule | None, nbytes: float) -> float:
        """One pooling launch (``PoolOp``) moving ``nbytes`` (rows gathered plus rows written):
        the machine's gather bandwidth of ``schedule``'s pooling (Triton's kernel, or torch's
        for None and ``cublas``) and its fixed cost. The Triton launch is not persistent, so
        an SM reserve does not bound it (``ficco.execute.cuda_pooling``)."""
        gather = self.machine.gather
        if gather is None:
            raise ValueError(
                f"machine: {self.machine.name} has no gather entry: the cost model cannot "
                "price embedding pooling (emb_a2a) there"
            )
        triton = schedule is not None and schedule.gemm is Gemm.TRITON
        gbs = gather.triton_gbs if triton else gather.torch_gbs
        return gather.fixed_us / 1e3 + nbytes / (gbs * 1e6)

    def transfer_cost(
        self, ce: bool, nbytes: int, same_node: bool, strided: bool, push: bool = False
    ) -> tuple[tuple[tuple[str, float, float], ...], float, float]:
        """(terms, work, host issue cost) of one transfer task of ``nbytes``: a copy-engine
        copy (``ce``; ``push``: its sender writes into the peer, else its receiver pulls) or
        an NCCL send/recv batch, to a peer on this node or not; a strided NCCL transfer is
        packed before the send and unpacked after the receive."""
        host = self.params.host
        if ce:
            cls = "ce_push" if push else "ce"
            terms = (self._link_term_cached(cls, nbytes, same_node),)
            return terms, self._costed(terms), host["copy_ms"]
        link = self._link_term_cached("p2p", nbytes, same_node)
        if strided:
            terms = (link, self._hbm_term("p2p_strided", 4 * nbytes, count=2))
            return terms, self._costed(terms), host["p2p_ms"] + host["strided_ms"]
        return (link,), self._costed((link,)), host["p2p_ms"]

    def reduce_cost(
        self, inputs: int, out_bytes: int
    ) -> tuple[tuple[tuple[str, float, float], ...], float, float]:
        """(terms, work, host issue cost) of the reduction of ``inputs`` partials into an
        output of ``out_bytes``; the issue cost is fitted per reduction (W = 2: one launch)."""
        launches, units = reduce_traffic(inputs)
        terms = (self._hbm_term("reduce", units * out_bytes, count=launches),)
        return terms, self._costed(terms), self.params.host["reduce_ms"]

    def _costed(self, terms: tuple[tuple[str, float, float], ...]) -> float:
        work = self._terms_cache.get(terms)
        if work is None:
            work = self._terms_cache[terms] = self._task_work(self._work(list(terms)))
        return work

    def _lower_cublas(
        self, plan: Plan, s: Schedule
    ) -> tuple[list[SimTask], list[tuple[int, tuple]]]:
        """(tasks with cuBLAS GEMMs and torch pooling, [(task position, its
        :meth:`compute_task_work` key)])."""
        problem = plan.problem
        if problem.pattern not in CALIBRATED_PATTERNS + REUSED_PATTERNS:
            raise ValueError(
                f"pattern: {problem.pattern.value} is not calibrated in the cost model "
                f"(calibrated: {', '.join(p.value for p in CALIBRATED_PATTERNS)})"
            )
        # transfers, local copies and collectives move the collective's matrix (A, or the
        # product: bf16 for fp8 inputs); reductions sum the product
        moved, out_b = spec_of(problem.pattern).moved_bytes, problem.output_bytes
        fp8 = problem.scaled  # GEMMs at FP8's roof (``ficco.model.fp8``)
        ce = s.transport.traits.cost_class is CostClass.CE  # one-sided copies, else NCCL batches
        serial = s.granularity is Granularity.SERIAL
        host = self.params.host
        widths = {spec.name: spec.shape[-1] for spec in plan.buffers}
        same_node = self.machine.gpus_per_node
        rank_node = plan.rank // same_node
        tasks: list[SimTask] = []
        gemm_at: list[tuple[int, tuple]] = []
        alias: dict[int, int] = {}  # plan task id -> sim task id (NCCL batches share one)
        tag_send: dict[int, int] = {}  # tag -> this rank's pushing send (push symmetry)
        pending_recv: list[tuple[int, int, tuple[int, ...]]] = []
        issued = host["fixed_ms"]
        # (tag, sim id, direction, bytes of that direction) of the open NCCL batch
        batch_lead: tuple[int, int, str, int] | None = None
        # a plan at W = 64 has thousands of transfers and GEMMs of a few sizes: their terms,
        # work and issue cost are looked up by size, not recomputed
        transfer_costs: dict[tuple, tuple] = {}  # transfer_cost arguments -> its costs
        gemm_work: dict[tuple, float] = {}
        copy_ms, p2p_ms, gemm_ms = host["copy_ms"], host["p2p_ms"], host["gemm_ms"]
        gemm_copy_ms = host["gemm_copy_ms"]
        # a SimTask from all seven fields without its keyword-parsing __new__ (a third of
        # the cost of a transfer's task)
        tuple_new = tuple.__new__
        for task in plan.tasks:
            op = task.op
            deps = task.deps
            if deps:
                if len(deps) == 1:
                    deps = (alias[deps[0]],) if deps[0] in alias else ()
                else:
                    deps = tuple([alias[d] for d in deps if d in alias])
            lane, kind, work, cost_issue = "compute", "sm", 0.0, 0.0
            terms: tuple[tuple[str, float, float], ...] = ()
            op_type = type(op)
            if op_type is TransferOp or isinstance(op, TransferOp):  # the commonest op first
                local = op.local
                rows, cols = local.rows, local.cols
                nbytes = moved(problem, rows[1] - rows[0], cols[1] - cols[0])
                if ce:
                    recv = op.direction is Direction.RECV
                    if op.initiator is not (PULL if recv else PUSH):  # not acting
                        if not recv:  # a pull's sender: nothing
                            continue
                        # pushed to us: wait for the peer's push of this tag
                        pending_recv.append((len(tasks), op.tag, deps))
                        alias[task.id] = len(tasks)
                        tasks.append(
                            tuple_new(SimTask, (len(tasks), "signal", 0.0, "ce", deps, 0.0, ()))
                        )
                        continue
                    # pushed copies write into the peer, pulled ones read from it
                    cost_key = (True, nbytes, op.peer // same_node == rank_node, False, not recv)
                    costs = transfer_costs.get(cost_key)
                    if costs is None:
                        costs = transfer_costs[cost_key] = self.transfer_cost(*cost_key)
                    terms, work, cost_issue = costs
                    issued += cost_issue
                    alias[task.id] = tag_send[op.tag] = len(tasks)
                    tasks.append(
                        tuple_new(SimTask, (len(tasks), "comm", work, "ce", deps, issued, terms))
                    )
                    batch_lead = None
                    continue
                if batch_lead is not None and batch_lead[0] == op.tag:
                    sim_id = batch_lead[1]  # the other half of an open batch
                    prev = tasks[sim_id]
                    # (a half without dependencies beside one with at most one changes
                    # nothing: the merge of those is the first's own)
                    if deps or len(prev.deps) > 1:
                        merged = tuple(sorted(set(prev.deps) | set(deps)))
                        tasks[sim_id] = prev._replace(deps=merged)
                    alias[task.id] = sim_id
                    if op.direction == batch_lead[2]:
                        # more than one half each way (emb_a2a's batch chunks: a run per
                        # table under the chunk's tag): the batch moves their sum
                        total = batch_lead[3] + nbytes
                        strided = cols[1] - cols[0] != widths[local.buffer]
                        key = (False, total, op.peer // same_node == rank_node, strided)
                        terms, work, _ = self.transfer_cost(*key)
                        tasks[sim_id] = tasks[sim_id]._replace(work_ms=work, terms=terms)
                        batch_lead = (*batch_lead[:3], total)
                    continue
                strided = cols[1] - cols[0] != widths[local.buffer]
                cost_key = (False, nbytes, op.peer // same_node == rank_node, strided)
                costs = transfer_costs.get(cost_key)
                if costs is None:
                    costs = transfer_costs[cost_key] = self.transfer_cost(*cost_key)
                terms, work, cost_issue = costs
                issued += cost_issue
                alias[task.id] = len(tasks)
                batch_lead = (op.tag, len(tasks), op.direction, nbytes)
                tasks.append(
                    tuple_new(SimTask, (len(tasks), "comm", work, "nccl", deps, issued, terms))
                )
                continue
            if op_type is GemmOp or isinstance(op, GemmOp):
                a_rows, a_cols = op.a.rows, op.a.cols
                b_cols = op.b.cols
                shape = (a_rows[1] - a_rows[0], b_cols[1] - b_cols[0], a_cols[1] - a_cols[0])
                if fp8:
                    shape = (*shape, True)
                work = gemm_work.get(shape)
                if work is None:
                    work = gemm_work[shape] = self.gemm_task_work(None, shape)
                gemm_at.append((len(tasks), shape))
                # the executor's cuBLAS call into an output that is not contiguous (a column
                # chunk, not accumulated) is a matmul into a temporary and a copy (an addmm_
                # fitted at no extra cost over a plain matmul: not a class of its own)
                out_cols = op.out.cols
                if (
                    not op.accumulate
                    and out_cols[1] - out_cols[0] != widths[op.out.buffer]
                    and op.out.rows[1] - op.out.rows[0] > 1
                ):
                    cost_issue = gemm_ms + gemm_copy_ms
                else:
                    cost_issue = gemm_ms
            elif isinstance(op, PoolOp):
                # every gathered row read and every pooled row written once, D wide
                rows = sum(
                    gathered_rows(problem, plan.rank, seg.bags) + seg.out.shape[0]
                    for chunk in op.chunks
                    for seg in chunk.segments
                )
                pool_key = ("pool", rows * problem.n * problem.dtype_bytes)
                work = gemm_work.get(pool_key)
                if work is None:
                    work = gemm_work[pool_key] = self.compute_task_work(None, pool_key)
                gemm_at.append((len(tasks), pool_key))
                cost_issue = gemm_ms
            elif isinstance(op, ReduceOp):
                terms, work, cost_issue = self.reduce_cost(len(op.inputs), op.out.numel * out_b)
                lane = "signal" if (ce and not serial) else task.stream.value
            elif isinstance(op, LocalCopyOp):
                lane, kind = task.stream.value, "ce"
                terms = (self._hbm_term("local", 2 * moved(problem, *op.dst.shape)),)
                cost_issue = copy_ms
            elif isinstance(op, CollectiveOp):
                lane, kind = "comm", "nccl"
                total = plan.buffer(op.dst).shape[0] if op.kind is Collective.ALL_GATHER else 0
                src = plan.buffer(op.src)
                total_bytes = moved(problem, src.shape[0], math.prod(src.shape[1:]))
                if op.kind is Collective.ALL_GATHER:
                    total_bytes = moved(problem, total, math.prod(src.shape[1:]))
                terms = tuple(self.collective_terms(op, problem.world, total_bytes))
                cost_issue = p2p_ms
            elif isinstance(op, NormOp):  # the predictor refuses such problems first
                raise ValueError(
                    f"task {task.id}: the cost model has no price for the add_rms_norm "
                    "epilogue (NormOp)"
                )
            else:  # pragma: no cover - the plan vocabulary is closed
                raise ValueError(f"task {task.id}: unknown op {type(op).__name__}")
            batch_lead = None
            issued += cost_issue
            if terms:
                work = self._costed(terms)
            alias[task.id] = len(tasks)
            tasks.append(tuple_new(SimTask, (len(tasks), lane, work, kind, deps, issued, terms)))
        for sim_id, tag, deps in pending_recv:
            if tag in tag_send:
                tasks[sim_id] = SimTask(sim_id, "signal", 0.0, "ce", (*deps, tag_send[tag]), 0.0)
        return tasks, gemm_at

    def host_ms(self, plan: Plan) -> float:
        """The eager host's issue time of the whole plan."""
        return issue_end_ms(self.lower(plan))


def issue_end_ms(tasks: list[SimTask]) -> float:
    """When the eager host has issued the last of ``tasks``."""
    return max((t.issue_ms for t in tasks), default=0.0)
