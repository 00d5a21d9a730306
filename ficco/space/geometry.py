"""Chunk geometry: the one definition of how a schedule cuts a problem.

Legality rules, the lowering (``ficco.plan``), the executors, the signatures and the
selector's features all call these functions, so a chunk has one size everywhere. It sits
beside the rules (below ``ficco.plan``) because the rules need it before any plan exists.

Per rank, ``S = M / W`` rows per shard:

=========  =====  ============================  ================================
pattern    split  one transfer chunk            one GEMM piece (rows x cols x k)
=========  =====  ============================  ================================
ag_gemm    m      rows/chunk x K                rows/chunk x N x K
ag_gemm    k      S x K/chunk (strided)         S x N x K/chunk (accumulates)
gemm_rs    m      rows/chunk x N                rows/chunk x N x K
gemm_rs    n      S x N/chunk (strided)         S x N/chunk x K
a2a_gemm   m      block rows/chunk x K          block rows/chunk x N x K
gemm_a2a   m      block rows/chunk x N          block rows/chunk x N x K
gemm_ar    m      rows/chunk x N                rows/chunk x N x K
gemm_ar    n      M (S with rs_ag) x N/chunk    M (S) x N/chunk x K
emb_a2a    m      block rows/chunk x D          block rows/chunk (pooled bags)
emb_a2a    b      T x samples/chunk x D         T x samples/chunk (pooled bags)
=========  =====  ============================  ================================

emb_a2a's ``m`` chunks are row ranges of a table-major block (table groups, then batch cuts
of a table); its ``b`` chunks cut the receiver's samples, a chunk holding those samples of
every table of the sender (``T`` runs of rows, one per table, strided in the block).

gemm_ar's direct schedules cut the whole M (one step: each chunk is all-reduced once, its
partial pushed to every peer); its ``+rs_ag`` schedules are gemm_rs's, cutting M/W-row shards,
plus an all-gather of the reduced chunks, so they move every chunk twice.

A *block* of the all-to-all patterns is what one rank sends another (its tokens for that
rank's experts); the geometry reports the largest block, since the slowest peer sets the pace.
``serial`` moves whole shards (blocks) with one collective and runs one GEMM; ``merged`` runs
one GEMM per peer step once that step's chunks arrived; ``fused`` runs one persistent GEMM
over all of M (its tiles wait on their chunk's flag, or store into the owner's buffer), while
the transfers stay per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from ficco.patterns import spec_of
from ficco.problem import Problem, split_evenly
from ficco.space.schedule import Compute, Granularity, Schedule, Split

#: Column chunks are cut on multiples of this many elements, so strided slices keep the
#: 16-byte alignment that TMA descriptors and vectorized copies need.
COLUMN_ALIGN = 8


def quantum(split: Split) -> int:
    """Smallest unit a chunk boundary may fall on along ``split``."""
    return 1 if split in (Split.M, Split.B) else COLUMN_ALIGN


def chunk_bounds(length: int, parts: int, quantum: int = 1) -> list[tuple[int, int]]:
    """Cut [0, length) into ``parts`` ranges on multiples of ``quantum``; sizes differ by at
    most one quantum (the ragged remainder goes to the last range). Empty ranges are dropped."""
    if length <= 0:
        return []
    units = -(-length // quantum)
    bounds, start = [], 0
    for count in split_evenly(units, min(parts, units)):
        stop = min(length, start + count * quantum)
        bounds.append((start, stop))
        start = stop
    return [b for b in bounds if b[1] > b[0]]


def split_extent(problem: Problem, split: Split, schedule: Schedule | None = None) -> int:
    """Length of the dimension a schedule's chunks cut, per shard (the pattern's shard rows:
    the largest block for a2a; the whole M for gemm_ar's direct all-reduce, which
    ``schedule=None`` means there)."""
    if split is Split.M:
        return spec_of(problem.pattern).shard_rows(problem, schedule)
    if split is Split.B:  # the most samples a rank receives (split_evenly of the batch)
        return -(-problem.m // problem.world)
    return problem.n if split is Split.N else problem.k


def chunks_per_shard(schedule: Schedule) -> int:
    """Chunks each shard is cut into: ``chunks`` for finer schedules, else one."""
    return schedule.chunks if schedule.granularity is Granularity.FINER else 1


def cut(length: int, schedule: Schedule) -> list[tuple[int, int]]:
    """The chunk ranges of a shard (or block) of ``length`` along the schedule's split."""
    return chunk_bounds(length, chunks_per_shard(schedule), quantum(schedule.split))


@dataclass(frozen=True, slots=True)
class Geometry:
    """What a schedule makes of a problem, on the busiest rank. Sizes are of the largest
    piece (the ragged last chunk is never larger than the others)."""

    steps: int
    """Peer steps, the local one included: 1 for serial (one collective) and for gemm_ar's
    direct all-reduce (every chunk goes to all peers at once), W otherwise."""
    chunks: int
    """Chunks per step actually cut (``chunks`` for finer schedules, else 1)."""
    transfer_rows: int
    transfer_cols: int
    transfer_bytes: int
    """One transfer chunk (serial: one peer's whole shard or block)."""
    gemm_rows: int
    gemm_cols: int
    gemm_k: int
    """One GEMM launch: ``[gemm_rows, gemm_k] @ [gemm_k, gemm_cols]``."""
    gemm_launches: int
    """GEMM launches per rank (pieces), over all steps; for the all-to-all patterns one per
    (step, chunk), each a grouped GEMM over the experts the chunk touches."""
    transfers: int
    """Transfers this rank receives or sends with peers (0 chunks of its own shard)."""

    @property
    def gemm_flops(self) -> int:
        return 2 * self.gemm_rows * self.gemm_cols * self.gemm_k


def geometry(problem: Problem, schedule: Schedule) -> Geometry:
    """The chunk geometry of ``schedule`` on ``problem`` (see the module's table)."""
    spec, split = spec_of(problem.pattern), schedule.split
    w = problem.world
    serial = schedule.granularity is Granularity.SERIAL
    steps = 1 if serial or spec.one_step(schedule) else w
    shard_rows, moved_cols = spec.shard_rows(problem, schedule), spec.moved_cols(problem)
    extent = split_extent(problem, split, schedule)
    ranges = cut(extent, schedule)
    n_chunks = max(len(ranges), 1)
    largest = max((hi - lo for lo, hi in ranges), default=0)

    if split is Split.M:
        transfer_rows, transfer_cols = largest, moved_cols
    elif split is Split.B:
        # every table's rows of the chunk's samples: the block's rows per sample (its tables)
        largest *= shard_rows // extent
        transfer_rows, transfer_cols = largest, moved_cols
    else:  # a column cut of the moved matrix: k for ag_gemm's A, n for gemm_rs's C
        transfer_rows, transfer_cols = shard_rows, largest

    if serial:
        # the whole gathered A / the whole partial C; all-to-all: every block received
        gemm_rows = spec.serial_gemm_rows(problem)
        gemm_cols, gemm_k, launches = problem.n, problem.k, 1
        transfer_rows, transfer_cols = shard_rows, moved_cols
    elif schedule.compute is Compute.FUSED:
        # one persistent launch over every chunk (M x N x K; gemm_ar: the whole M, direct;
        # emb_a2a: every bag of the rank's tables): the rows the serial GEMM covers
        gemm_rows, gemm_cols, gemm_k, launches = (
            spec.serial_gemm_rows(problem),
            problem.n,
            problem.k,
            1,
        )
    elif schedule.compute is Compute.MERGED:
        gemm_rows, gemm_cols, gemm_k, launches = shard_rows, problem.n, problem.k, steps
    else:
        gemm_rows = largest if split in (Split.M, Split.B) else shard_rows
        gemm_cols = largest if split is Split.N else problem.n
        gemm_k = largest if split is Split.K else problem.k
        launches = steps * n_chunks
    # gemm_ar's +rs_ag: each reduced chunk is all-gathered too
    transfers = (w - 1) * (1 if serial else n_chunks) * spec.transfer_passes(schedule)
    return Geometry(
        steps=steps,
        chunks=1 if serial else n_chunks,
        transfer_rows=transfer_rows,
        transfer_cols=transfer_cols,
        transfer_bytes=spec.moved_bytes(problem, transfer_rows, transfer_cols),
        gemm_rows=gemm_rows,
        gemm_cols=gemm_cols,
        gemm_k=gemm_k,
        gemm_launches=launches,
        transfers=transfers,
    )
