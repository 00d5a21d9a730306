"""emb_a2a: embedding-bag pooling, then the all-to-all of pooled rows (DLRM's model-parallel
embeddings).

The problem: ``T`` embedding tables of ``tables[t]`` rows and ``D = n`` columns, a global
batch of ``B = m`` samples with, per table, one bag of indices per sample (``k``: the pooling
factor, the mean bag size; ``bags``: ``fixed`` sizes k, ``uniform`` sizes drawn from
1 .. 2k-1, or one given size per table, k the largest), pooled by ``pooling`` (sum or mean).

Table-wise sharding: tables are dealt out whole and in order, rank r owning the contiguous
tables ``[t0_r, t1_r)`` (``T_r`` of them, counts ``split_evenly(T, W)``: at least one each).
Samples go to ranks the same way: rank d receives ``B_d`` samples from ``b0_d`` (counts
``split_evenly(B, W)``, larger first: B need not divide by W).

Rank r holds ``weights [sum R_t, D]`` (its tables stacked), ``indices`` and ``offsets`` (int64:
bag ``j = t*B + b`` of local table t and sample b holds the ``weights`` rows
``indices[offsets[j]:offsets[j+1]]``), pools every bag of its tables for all B samples, and
sends rank d its samples' pooled rows for each of its tables. Rank d ends with
``y [T*B_d, D]``, table-major: row ``t*B_d + i`` is global table t pooled for its i-th sample.
The bags are the problem's, drawn by :func:`lookups` (one seeded generator per table), so any
rank can regenerate any other's and the reference needs no communication.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import ficco.validate as validate
from ficco.patterns import Pattern, register
from ficco.patterns import _dense as dense
from ficco.patterns import _routed as routed
from ficco.patterns.spec import (
    BASELINE_COMM,
    SERIAL_PLAN_PARTS,
    Collective,
    ModelSupport,
    PatternSpec,
    ProblemField,
    Ref,
    Sizes,
)
from ficco.problem import split_evenly
from ficco.space.schedule import Split
from ficco.validate import InputError

if TYPE_CHECKING:
    from ficco.problem import Problem
    from ficco.space.schedule import Schedule

POOLINGS = ("sum", "mean")
BAG_SIZES = ("fixed", "uniform")
#: bags of global table t are drawn from ``torch.Generator().manual_seed(BAG_SEED + t)``
BAG_SEED = 20_240_601
#: baseline: the all-to-all alone as the ``serial/ce`` plan's pushes (copy engines, captured
#: where the backend captures): beside NCCL's, so the ideal takes the fastest real exchange
BASELINE_COMM_CE = "comm_alone_ce"


def _ranges(counts: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


def _counts(name: str, value: Any) -> tuple[int, ...]:
    """Comma-separated text (``'1000,20,300'``) or a sequence as a tuple of integers."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(validate.integer(name, item) for item in items)


def _check_tables(p: Problem, table: Any) -> tuple[int, ...]:
    """Every table's rows, at least W tables (table-wise sharding), and a batch of at least W
    (every rank receives its samples: the pattern's one rule beyond its fields)."""
    if table is None or isinstance(table, str | bytes) or not hasattr(table, "__iter__"):
        raise InputError("tables", table, "emb_a2a needs the rows of each table, e.g. (1000, 20)")
    rows = tuple(
        validate.integer("tables", r, minimum=1, rule="every table needs >= 1 row", text=False)
        for r in table
    )
    if len(rows) < p.world:
        raise InputError(
            "tables",
            table,
            f"table-wise sharding gives every rank whole tables: needs >= world={p.world} "
            f"tables, got {len(rows)}",
        )
    if p.m < p.world:
        raise InputError(
            "m", p.m, f"every rank receives its samples: the batch must be >= world={p.world}"
        )
    return rows


def _check_pooling(p: Problem, pooling: Any) -> str:
    if pooling not in POOLINGS:
        raise InputError("pooling", pooling, f"must be one of {', '.join(POOLINGS)}")
    return pooling


def _check_bags(p: Problem, bags: Any) -> str | tuple[int, ...]:
    """``fixed``, ``uniform``, or one size per table (``p.tables``: checked before), the
    largest being k."""
    if isinstance(bags, list | tuple):
        sizes_ = tuple(
            validate.integer("bags", b, minimum=1, rule="every bag size must be >= 1", text=False)
            for b in bags
        )
        if len(sizes_) != len(p.tables):
            raise InputError(
                "bags",
                bags,
                f"per-table bag sizes need one per table: {len(p.tables)} tables, "
                f"{len(sizes_)} sizes",
            )
        if max(sizes_) != p.k:
            raise InputError(
                "k", p.k, f"with per-table bag sizes, k is the largest of them ({max(sizes_)})"
            )
        return sizes_
    if bags not in BAG_SIZES:
        raise InputError(
            "bags", bags, f"must be one of {', '.join(BAG_SIZES)}, or one size per table"
        )
    return bags


def _text(value: str | tuple[int, ...]) -> str:
    return value if isinstance(value, str) else ",".join(map(str, value))


#: the problem's fields of its own: ``m`` is the global batch B, ``n`` the embedding dim D,
#: ``k`` the pooling factor (mean indices per bag)
FIELDS = (
    ProblemField(
        name="tables",
        help="rows of each embedding table (skewed sizes allowed, at least W tables), "
        "comma-separated (m is the batch, n the dim, k the pooling factor)",
        parse=lambda value: _counts("tables", value),
        check=_check_tables,
        key=lambda rows: f"tables{_text(rows)}",
        default=None,
    ),
    ProblemField(
        name="pooling",
        help=f"how a bag's rows are pooled: {' or '.join(POOLINGS)}",
        parse=str,
        check=_check_pooling,
        key=str,
        default="sum",
    ),
    ProblemField(
        name="bags",
        help="bag sizes, fixed (k), uniform (1 .. 2k-1, seeded per table) or one per "
        "table, comma-separated",
        parse=lambda value: value if value in BAG_SIZES else _counts("bags", value),
        check=_check_bags,
        key=_text,
        default="fixed",
    ),
)


# --- layout: what every layer (plans, sizes, references) reads ------------------------------


def table_ranges(p: Problem) -> list[tuple[int, int]]:
    """``[t0_r, t1_r)``: the global tables rank r owns."""
    assert p.tables is not None
    return _ranges(split_evenly(len(p.tables), p.world))


def sample_ranges(p: Problem) -> list[tuple[int, int]]:
    """``[b0_d, b1_d)``: the samples rank d receives."""
    return _ranges(split_evenly(p.m, p.world))


def weight_rows(p: Problem, rank: int) -> int:
    assert p.tables is not None
    t0, t1 = table_ranges(p)[rank]
    return sum(p.tables[t0:t1])


def block_rows(p: Problem, src: int, dst: int) -> int:
    """Pooled rows rank ``src`` sends rank ``dst`` (its tables x dst's samples)."""
    (t0, t1), (b0, b1) = table_ranges(p)[src], sample_ranges(p)[dst]
    return (t1 - t0) * (b1 - b0)


def largest_block_rows(p: Problem, schedule: Schedule | None = None) -> int:
    w = p.world
    return max(block_rows(p, s, d) for s in range(w) for d in range(w))


def max_bag(p: Problem) -> int:
    """The most indices one bag may hold (``uniform``: 2k - 1)."""
    return 2 * p.k - 1 if p.bags == "uniform" else p.k


def pooled_rows(p: Problem) -> int:
    """The most bags one rank pools (its tables x the whole batch)."""
    return max(t1 - t0 for t0, t1 in table_ranges(p)) * p.m


def received_from_peers(p: Problem) -> list[int]:
    w = p.world
    return [sum(block_rows(p, s, d) for s in range(w) if s != d) for d in range(w)]


def flops(p: Problem) -> int:
    """Additions of the pooling, all ranks: D per index, k indices per bag on average."""
    return sum(mean_bags(p)) * p.m * p.n


def mean_bags(p: Problem) -> tuple[int, ...]:
    """Each table's mean bag size (``k``, or the given per-table sizes)."""
    assert p.tables is not None
    return p.bags if isinstance(p.bags, tuple) else (p.k,) * len(p.tables)


def gathered_rows(p: Problem, rank: int, bags: tuple[int, int]) -> float:
    """The ``weights`` rows rank ``rank``'s bags ``[bags[0], bags[1])`` gather, on average
    (each bag's table's mean bag size: what the cost model prices, with no bags drawn)."""
    t0 = table_ranges(p)[rank][0]
    means = mean_bags(p)
    j0, j1 = bags
    total = 0.0
    while j0 < j1:
        t = j0 // p.m  # bag j = t*B + b: local table t
        end = min(j1, (t + 1) * p.m)
        total += (end - j0) * means[t0 + t]
        j0 = end
    return total


def comm_bytes(p: Problem) -> int:
    return max(received_from_peers(p)) * p.n * p.dtype_bytes


def sizes(p: Problem) -> Sizes:
    """The most bags one rank pools; the most table elements one rank holds; the largest
    block between two ranks."""
    w, b = p.world, p.dtype_bytes
    block = max(block_rows(p, s, d) for s in range(w) for d in range(w) if s != d)
    weights = max(weight_rows(p, r) for r in range(w)) * p.n
    return Sizes(pooled_rows(p), weights, comm_bytes(p), block * p.n * b, 0)


def plan_key(p: Problem, s: Schedule) -> tuple:
    return (s.transport, s.order)


# --- the bags (torch) -------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def lookups(p: Problem, rank: int) -> dict:
    """``{"indices", "offsets"}`` (int64, CPU) of rank ``rank``: the one definition of the
    problem's bags. Table t's bag sizes, then its indices (uniform over its rows), are drawn
    from ``torch.Generator().manual_seed(BAG_SEED + t)``; indices are offset by the table's
    first row in ``weights``; the tail past the last bag is zeros. Shared: callers copy,
    never write."""
    import torch

    assert p.tables is not None
    t0, t1 = table_ranges(p)[rank]
    sizes_, indices, first = [], [], 0
    for t in range(t0, t1):
        gen = torch.Generator().manual_seed(BAG_SEED + t)
        if p.bags == "uniform":
            size = torch.randint(1, 2 * p.k, (p.m,), generator=gen, dtype=torch.int64)
        else:
            size = torch.full((p.m,), mean_bags(p)[t], dtype=torch.int64)
        total = int(size.sum())
        indices.append(torch.randint(0, p.tables[t], (total,), generator=gen) + first)
        sizes_.append(size)
        first += p.tables[t]
    size = torch.cat(sizes_)
    offsets = torch.zeros(size.numel() + 1, dtype=torch.int64)
    torch.cumsum(size, 0, out=offsets[1:])
    # the ``indices`` buffer holds the most a rank's bags may (``max_bag``): the tail unused
    padded = torch.zeros(size.numel() * max_bag(p), dtype=torch.int64)
    used = torch.cat(indices)
    padded[: used.numel()] = used
    return {"indices": padded, "offsets": offsets}


def index_inputs(p: Problem, rank: int, name: str):
    """The values of the integer input ``name`` (``indices`` or ``offsets``) of ``rank``."""
    return lookups(p, rank)[name]


def pool(weights, indices, offsets, bags: tuple[int, int], mode: str, dtype=None):
    """Bags ``[bags[0], bags[1])`` pooled (``[n_bags, D]``): fp32 accumulation (float64 for a
    float64 ``weights``), in ``dtype`` (None: ``weights``' own). An empty bag pools to zeros."""
    import torch

    j0, j1 = bags
    bounds = offsets[j0 : j1 + 1].to(weights.device)
    first, last = int(bounds[0]), int(bounds[-1])
    idx = indices[first:last].to(weights.device)
    acc = torch.float64 if weights.dtype == torch.float64 else torch.float32
    rows = weights.index_select(0, idx).to(acc)
    counts = bounds[1:] - bounds[:-1]
    bag_of = torch.repeat_interleave(torch.arange(j1 - j0, device=weights.device), counts)
    out = torch.zeros((j1 - j0, weights.shape[1]), dtype=acc, device=weights.device)
    out.index_add_(0, bag_of, rows)
    if mode == "mean":
        out /= counts.clamp(min=1).unsqueeze(1).to(acc)
    return out.to(weights.dtype if dtype is None else dtype)


def embedding_bag(weights, indices, offsets, bags: tuple[int, int], mode: str, host_offsets=None):
    """torch's EmbeddingBag over the same bags, in ``weights``' dtype: the plain way, and
    how schedules that do not pool with ficco's Triton kernel pool (serial's baseline).
    ``host_offsets``: the same offsets in host memory, where the bags' bounds are read (a read
    of device ``offsets`` would wait for the GPU at every call, and no CUDA graph could
    capture it)."""
    import torch.nn.functional as F

    j0, j1 = bags
    bounds = offsets if host_offsets is None else host_offsets
    first, last = int(bounds[j0]), int(bounds[j1])
    idx = indices[first:last].to(weights.device)
    offs = (offsets[j0:j1] - first).to(weights.device)
    return F.embedding_bag(idx, weights, offs, mode=mode, include_last_offset=False)


def reference(p: Problem, rank: int, inp) -> tuple:
    """Rank's ``y``: every table pooled for its samples, by the table's owner's bags, in
    float64 and the plain way (torch's EmbeddingBag in the working dtype)."""
    import torch

    b0, b1 = sample_ranges(p)[rank]
    exact, plain = [], []
    for owner, (t0, t1) in enumerate(table_ranges(p)):
        weights, bags = inp(owner, "weights"), lookups(p, owner)
        for t in range(t1 - t0):
            span = (t * p.m + b0, t * p.m + b1)
            exact.append(pool(weights.double(), bags["indices"], bags["offsets"], span, p.pooling))
            plain.append(embedding_bag(weights, bags["indices"], bags["offsets"], span, p.pooling))
    return torch.cat(exact), torch.cat(plain)


def _blocks(p: Problem, tensors: dict, rank: int, exact: bool):
    """This rank's pooled rows in the ``pooled`` layout (per destination, table-major)."""
    import torch

    weights, indices, offsets = tensors["weights"], tensors["indices"], tensors["offsets"]
    t0, t1 = table_ranges(p)[rank]
    out = []
    for b0, b1 in sample_ranges(p):
        for t in range(t1 - t0):
            span = (t * p.m + b0, t * p.m + b1)
            if exact:
                out.append(pool(weights, indices, offsets, span, p.pooling, torch.float32))
            else:
                out.append(embedding_bag(weights, indices, offsets, span, p.pooling))
    return torch.cat(out)


def reference_by_collectives(p: Problem, tensors: dict, device) -> tuple:
    """This rank's bags pooled here (fp32, and the plain way), then ``all_to_all_single``."""
    import torch.distributed as dist

    rank, w = dist.get_rank(), p.world
    send = [block_rows(p, rank, d) for d in range(w)]
    recv = [block_rows(p, s, rank) for s in range(w)]
    exact = routed.exchange(_blocks(p, tensors, rank, True), send, recv, device)
    plain = routed.exchange(_blocks(p, tensors, rank, False), send, recv, device)
    return exact, plain


SPEC = register(
    PatternSpec(
        pattern=Pattern.EMB_A2A,
        collective=Collective.ALL_TO_ALL,
        routed=False,
        rows_per_rank=False,  # B need not divide by W: ranks receive split_evenly(B, W)
        # m: row chunks of a block (table groups, then batch cuts of a table); b: batch chunks
        # of every table (ficco.space.geometry)
        splits=(Split.M, Split.B),
        fused=True,
        batched_blocks=True,
        relay=False,
        in_selector=False,  # no measured profiles yet: tables cannot answer it
        # transfers and NCCL as calibrated; pooling by the machine's gather bandwidth
        cost_model=ModelSupport.REUSED,
        comm_alone=(BASELINE_COMM, BASELINE_COMM_CE),
        flops=flops,
        comm_bytes=comm_bytes,
        moved_dim="n",
        shard_rows=largest_block_rows,
        serial_gemm_rows=pooled_rows,
        one_step=dense.never,
        transfer_passes=dense.once,
        plan_key=plan_key,
        extra_roundings=dense.no_roundings,
        sizes=sizes,
        lookup_sizes="emb_a2a",
        reference=reference,
        reference_by_collectives=reference_by_collectives,
        cuda_baselines=SERIAL_PLAN_PARTS,
        lowering=Ref("ficco.plan.emb_a2a:plan_emb_a2a"),
        buffers=Ref("ficco.plan.emb_a2a:emb_buffers"),
        # pooled embedding rows, no GEMM: fp8 (scaled GEMM inputs) does not apply
        scaled_inputs=False,
        problem_fields=FIELDS,
        work_is_gather=True,
    )
)
