"""GEMM kernel configurations: the one place where the tuning space is stated.

A `GemmConfig` is a frozen value (block shape, pipeline depth, warps, grouping); enumerating
the space and pruning it per shape never touches CUDA or Triton, so this module is plain
Python. Each pruning rule is one predicate, used by `candidate_configs`:

- `fits_shared_memory`: the pipelined A/B tiles plus the epilogue's staging tile must fit the
  device's opt-in shared memory per block (232,448 bytes on H100/H200).
- `suits_shape`: a block far larger than the problem only computes padding.

Where the space came from (leads, each re-measured by the tuner on the device):
- Triton's persistent-matmul tutorial settles on 128x256x64, 4 stages, 8 warps, with the
  epilogue split in two halves (frees 32 KiB of shared memory for the 4th stage) on Hopper.
- A plain tiled Triton GEMM autotuned over 12 configurations (blocks 64-256, 2-5 stages,
  4 or 8 warps) reached 0.92x cuBLAS on chunk shapes of 256-4096 rows on an H200; the best
  configuration moved with the shape, so small-M (64-row) and square 128x128 tiles stay in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ficco.defaults import SM_COUNT

# Opt-in shared memory per block on sm_90 (H100, H200): 227 KiB.
HOPPER_SHARED_MEMORY_BYTES = 232_448
# Pipeline depth: cuBLAS streams a decode weight through up to 16 stages of 64-deep K steps.
MAX_STAGES = 16
# Most K ranges per tile in the decode kernel (each writes an fp32 partial that the tile's
# last arriver reads back).
MAX_SPLIT_K = 32
# Most chunks one fused tile range groups (`GemmConfig.chunk_group`): W x chunks per rank.
MAX_CHUNK_GROUP = 64
# Chunks of at most this many rows are offered grouped (`fused_candidate_configs`): a chunk's
# GEMM does `rows` FLOPs per byte of bf16 B it reads, and H100/H200 do 206-295 FLOPs per byte
# of HBM, so below that a chunk is bound by B's reads and reading B once per group pays. On
# one H200 (profiles/h200/NOTES_gemm.md) grouping 64- and 128-row chunks ran 1.08-1.57x
# faster at 9 of 16 shapes (arriving chunks: 0.89-1.03x the chunk-by-chunk time); at 512-1024
# rows it gained at most 3.5% with all flags set and cost up to 1.25x where chunks arrived.
CHUNK_GROUP_MAX_ROWS = 256


def _is_power_of_two(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class GemmConfig:
    """One point of the GEMM tuning space."""

    block_m: int
    """Rows of C computed by one tile (power of two, 16-256)."""
    block_n: int
    """Columns of C computed by one tile (power of two, 16-256)."""
    block_k: int
    """Depth of one K step (power of two, 16-256)."""
    group_m: int = 8
    """Tiles along M visited together before moving along N (L2 reuse of B's columns)."""
    num_stages: int = 3
    """Software-pipeline depth (shared-memory buffers for A/B tiles)."""
    num_warps: int = 8
    """Warps per persistent program (4 = one warpgroup, 8 = two)."""
    epilogue_subtile: bool = False
    """Store C in two [block_m, block_n / 2] halves: halves the epilogue's staging tile."""
    split_tail: bool = False
    """Split the tiles of the last, partly filled wave along K across the idle programs
    (stream-K's data-parallel + split tail); see `split_plan`. The TMA kernel, and the fused
    kernel (where its whole launch is one short wave, or its last chunk's tiles are)."""
    split_k: int = 1
    """K ranges per output tile in the split-K decode kernel (`ficco.kernels.decode`): 1 is
    the persistent kernels; 2 or more runs every tile as that many K ranges, for few rows
    (decode M = 1 ... 512), where a GEMM streams the weight and whole tiles leave SMs idle."""
    swap_ab: bool = False
    """Compute out^T = b^T a^T in the TMA kernel: N runs in the MMA's M dimension (64 rows a
    warpgroup) and the few rows of a decode GEMM in its N dimension (16 and up), so an
    [M <= 64, N] tile wastes no MMA rows and its shared memory goes to the weight's pipeline.
    `block_m` and `block_n` still name the output tile's rows and columns."""
    warp_specialize: bool = False
    """The FP8 kernel only (`ficco.kernels.scaled`): Triton's warp specialization on its K
    loop (`tl.range(..., warp_specialize=True)`), the tile loop then not flattened. The bf16
    kernels refuse it: on one H100 (Triton 3.6) its four big tiles were offered on 214 shapes
    and their best ran at 1.10x the pick's time (median; profiles/h100/NOTES_gemm.md)."""
    programs_per_sm: int = 1
    """Persistent programs per SM of a full-GPU budget (1 or 2; the FP8 and fused kernels, and
    only the FP8 space offers 2): with 2, one program's tensor-core work runs while the
    other's waits on its fp32 promotion adds. A budget below the GPU's SM count launches one
    per SM (two per SM could spread over the SMs the budget leaves free)."""
    promote_every: int = 1
    """FP8 kernel: K steps whose products the tensor cores sum before one fp32 promotion (1:
    every step, as cuBLASLt's default; n > 1: n steps in a pipelined inner loop, then one
    add: fewer waits on the wgmma, n x BLOCK_K products summed at the tensor cores' precision)."""
    lagged_promotion: bool = False
    """FP8 kernel: K steps taken in pairs, each step's products summed by the tensor cores
    apart and added to the fp32 accumulator one step late (the pair's second while the next
    pair's first runs), so the fp32 adds overlap tensor-core work instead of waiting on it;
    the precision of promotion every K step. The tile loop is then not flattened."""
    chunk_group: int = 1
    """Fused kernel (`ficco.kernels.fused`): consecutive chunks whose tiles are numbered as one
    row range, grouped by `group_m` across their row blocks, so the tiles that read one column
    block of B run side by side and B is read once per group rather than once per chunk (few
    rows a chunk: B's reads are most of the time). 1 numbers tiles chunk by chunk, the order
    chunks arrive in; a group's first tiles wait on each of its chunks. Applies to launches
    whose chunks only wait and have equal tile counts (`FusedGemm.chunk_group`)."""

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if not (_is_power_of_two(value) and 16 <= value <= 256):
                raise ValueError(
                    f"GemmConfig.{name} must be a power of two in [16, 256], got {value}"
                )
        if not (_is_power_of_two(self.group_m) and self.group_m <= 64):
            raise ValueError(f"GemmConfig.group_m must be a power of two <= 64, got {self.group_m}")
        if not 1 <= self.num_stages <= MAX_STAGES:
            raise ValueError(
                f"GemmConfig.num_stages must be in [1, {MAX_STAGES}], got {self.num_stages}"
            )
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(
                f"GemmConfig.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}"
            )
        if self.epilogue_subtile and not self.swap_ab and self.block_n < 32:
            raise ValueError("GemmConfig.epilogue_subtile needs block_n >= 32")
        if not 1 <= self.split_k <= MAX_SPLIT_K:
            raise ValueError(
                f"GemmConfig.split_k must be in [1, {MAX_SPLIT_K}], got {self.split_k}"
            )
        if self.split_k > 1 and (self.split_tail or self.epilogue_subtile or self.swap_ab):
            raise ValueError(
                "GemmConfig.split_k > 1 (the decode kernel) takes neither split_tail, "
                "epilogue_subtile nor swap_ab"
            )
        if self.warp_specialize and (self.split_tail or self.split_k > 1):
            raise ValueError("GemmConfig.warp_specialize takes neither split_tail nor split_k > 1")
        if not 1 <= self.promote_every <= 16:
            raise ValueError(
                f"GemmConfig.promote_every must be in [1, 16], got {self.promote_every}"
            )
        if self.lagged_promotion and (self.promote_every > 1 or self.warp_specialize):
            raise ValueError(
                "GemmConfig.lagged_promotion takes neither promote_every > 1 nor warp_specialize"
            )
        if self.programs_per_sm not in (1, 2):
            raise ValueError(
                f"GemmConfig.programs_per_sm must be 1 or 2, got {self.programs_per_sm}"
            )
        if not 1 <= self.chunk_group <= MAX_CHUNK_GROUP:
            raise ValueError(
                f"GemmConfig.chunk_group must be in [1, {MAX_CHUNK_GROUP}], got {self.chunk_group}"
            )
        if self.chunk_group > 1 and (self.split_k > 1 or self.swap_ab):
            raise ValueError(
                "GemmConfig.chunk_group > 1 (the fused kernel) takes neither split_k > 1 nor "
                "swap_ab"
            )
        if self.swap_ab and self.epilogue_subtile and self.block_m < 32:
            raise ValueError("GemmConfig.epilogue_subtile with swap_ab needs block_m >= 32")

    @property
    def name(self) -> str:
        """Stable short form, e.g. `128x256x64_g8_s4_w8_sub`."""
        sub = "_sub" if self.epilogue_subtile else ""
        split = "_splittail" if self.split_tail else ""
        split_k = f"_splitk{self.split_k}" if self.split_k > 1 else ""
        swap = "_swap" if self.swap_ab else ""
        per_sm = f"_p{self.programs_per_sm}" if self.programs_per_sm > 1 else ""
        per_sm += f"_pe{self.promote_every}" if self.promote_every > 1 else ""
        ws = "_ws" if self.warp_specialize else ""
        ws += "_lag" if self.lagged_promotion else ""
        group = f"_cg{self.chunk_group}" if self.chunk_group > 1 else ""
        return (
            f"{self.block_m}x{self.block_n}x{self.block_k}_g{self.group_m}"
            f"_s{self.num_stages}_w{self.num_warps}{swap}{sub}{split}{split_k}{ws}"
            f"{per_sm}{group}"
        )

    @property
    def decode(self) -> bool:
        """Runs in the split-K decode kernel (`ficco.kernels.decode`)."""
        return self.split_k > 1

    def to_dict(self) -> dict[str, int | bool]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GemmConfig:
        """Inverse of `to_dict`; raises ValueError on unknown or missing fields. A retired
        field at its old default (`_RETIRED_FIELDS`: tuning caches written before it went)
        is dropped; at any other value the entry names a kernel that no longer exists."""
        if not isinstance(d, dict):
            raise ValueError(f"a GemmConfig entry must be a JSON object, got {type(d).__name__}")
        for name, default in _RETIRED_FIELDS.items():
            if name in d and d[name] == default:
                d = {key: value for key, value in d.items() if key != name}
        try:
            return cls(**d)
        except TypeError as exc:  # unknown or missing keys
            raise ValueError(f"bad GemmConfig fields {sorted(d)}: {exc}") from exc

    def shared_memory_bytes(self, in_bytes: int, out_bytes: int, accumulate: bool = False) -> int:
        """`num_stages` A [BM, BK] + B [BK, BN] buffers plus C's staging tile (two when
        accumulating: the C tile read back). Matches Triton 3.6's sm_90 TMA kernel to within
        its 32-40 bytes of barriers."""
        steps = self.num_stages * (2 if self.lagged_promotion else 1)  # lagged: K step pairs
        ab = steps * (self.block_m * self.block_k + self.block_k * self.block_n) * in_bytes
        c_cols = self.block_n // 2 if self.epilogue_subtile else self.block_n
        return ab + (2 if accumulate else 1) * self.block_m * c_cols * out_bytes


# Fields GemmConfig had once, with their default: `stream_k` (the last wave's K steps dealt
# out to every program; slower than the space's pick on 55 of 56 shapes of one H100, its
# fp32 partials through memory costing about the wave it saved).
_RETIRED_FIELDS = {"stream_k": False}


def _c(bm, bn, bk, stages, warps, group=8, sub=False, split=False) -> GemmConfig:
    return GemmConfig(bm, bn, bk, group, stages, warps, sub, split)


# The GPU tuning space (bf16/fp16 on Hopper), 18 points. Big tiles first (large GEMMs), then
# square 128x128, then 64-row tiles for chunk shapes whose M or tile count is small.
GPU_CONFIGS: tuple[GemmConfig, ...] = (
    _c(128, 256, 64, 4, 8, sub=True),  # the tutorial's Hopper choice
    _c(128, 256, 64, 3, 8),
    _c(128, 256, 64, 3, 8, group=16),
    _c(256, 128, 64, 4, 8, sub=True),
    _c(256, 128, 64, 3, 8),
    _c(128, 128, 64, 4, 8),
    _c(128, 128, 64, 5, 8, sub=True),
    _c(128, 128, 64, 4, 4),
    _c(128, 128, 128, 3, 8),
    _c(128, 128, 128, 3, 4),
    _c(128, 64, 64, 5, 4),
    _c(64, 256, 64, 4, 4),
    _c(64, 256, 64, 4, 8, sub=True),
    _c(64, 128, 64, 5, 4),
    _c(64, 128, 128, 4, 4),
    _c(64, 64, 128, 4, 4),
    _c(64, 64, 64, 6, 4),
    _c(128, 256, 32, 6, 8, sub=True),
    # Widened: grouping, deeper pipelines and narrower K steps around the winners above.
    _c(128, 256, 64, 4, 8, group=4, sub=True),
    _c(128, 256, 64, 4, 8, group=16, sub=True),
    _c(256, 128, 64, 4, 8, group=16, sub=True),
    _c(128, 128, 64, 6, 8, sub=True),
    _c(128, 128, 64, 5, 4, sub=True),
    _c(128, 64, 128, 4, 4),
    _c(64, 128, 64, 7, 4),
    # Around one warpgroup's 128x128 tile with the split epilogue, the pick of five of the
    # seven shapes below 0.95x cuBLAS on one H100 (2048x3072x4096, 256x5120x8192, ...):
    # a deeper pipeline, wider K steps, coarser grouping.
    _c(128, 128, 64, 6, 4, sub=True),
    _c(128, 128, 128, 3, 4, sub=True),
    _c(128, 128, 64, 5, 4, group=16, sub=True),
    # (64x256x64, 5 stages, 8 warps, split epilogue was here: Triton 3.6 asks 253,992 bytes of
    # shared memory for it on an H100, past the limit its estimate said it fits)
)
#: The first 18 points of GPU_CONFIGS: the space before it was widened (benchmarks compare
#: the best of these with the best of the whole space).
GPU_CONFIGS_BEFORE_WIDENING = 18

# Swap-AB tiles (`GemmConfig.swap_ab`) for decode rows, M <= SWAP_MAX_ROWS: the weight's N in
# the MMA's M dimension, (block_n, block_k, stages, warps) with deep pipelines over the weight;
# the output tile's rows are the fewest powers of two >= 16 that cover M (`swap_rows`).
SWAP_MAX_ROWS = 64
SWAP_TILES: tuple[tuple[int, int, int, int], ...] = (
    (128, 128, 5, 4),
    (128, 64, 8, 4),
    (64, 128, 6, 4),
    (128, 256, 3, 4),
    (256, 64, 5, 8),
    # 32 columns of the weight a tile: a small weight's columns fill one wave of whole tiles
    # (4096 columns: 128 tiles on 132 SMs) where 64 leave half the programs to a split tail,
    # whose partials and last-arriver sum cost about a microsecond on a ~10 us GEMM
    (32, 256, 4, 4),
    (32, 128, 6, 4),
    # a deeper pipeline of 128-deep steps: the pick at 3 of 190 decode shapes, the fastest
    # within 1% at 17 (one H200, profiles/h200/NOTES_gemm.md). cuBLAS's own decode tiles (64x8 and 64x16 in 16 stages
    # of 64-deep steps, profiles/h200/library_kernels_decode_callAL.json) as swap-AB tiles,
    # 64x64 and 32x64 in 16 stages, 32x128 in 12, were never within 1% of the fastest: this
    # kernel's one partition waits on each step's loads and wgmma, so fewer, deeper steps win
    (64, 128, 8, 4),
)
INTERPRETER_SWAP_TILES: tuple[tuple[int, int, int, int], ...] = ((32, 16, 1, 4),)

# The CPU interpreter (TRITON_INTERPRET=1) runs every program serially in NumPy: small blocks
# keep tests fast, and timing there says nothing about a GPU.
INTERPRETER_CONFIGS: tuple[GemmConfig, ...] = (
    _c(16, 16, 16, 1, 4, group=4),
    _c(32, 32, 32, 1, 4, group=4),
    _c(32, 64, 32, 1, 4, group=4, sub=True),
    _c(16, 32, 16, 1, 4, group=4, split=True),
)

# The split-K decode kernel's tiles (`ficco.kernels.decode`), for M <= DECODE_MAX_ROWS, timed
# beside the persistent space by scripts/bench_decode_gemm.py: rows
# as few as the dot allows (16) up to 64/128, wide N tiles with deep pipelines (the weight
# stream), K steps of 64-256. Its split (`split_k`) is chosen per shape (`decode_splits`).
DECODE_MAX_ROWS = 512
# Weight-stream tiles for the persistent kernel at M <= DECODE_MAX_ROWS: cuBLAS's picks at 128
# rows of the small decode weights on one H200 (64x64_64x13, 128x64_64x8: few columns, deep
# pipelines; profiles/h200/library_kernels_decode_callAL.json). The pick at 5 of 190 decode
# shapes, all at 128-256 rows (one H200, profiles/h200/NOTES_gemm.md: 128x5120x4096 1.013 of cuBLAS, 0.955 before;
# 128x4096x4096 0.929, 0.877 before); cuBLAS's 64x32_64x16 never within 1% of the fastest.
WEIGHT_STREAM_CONFIGS: tuple[GemmConfig, ...] = (
    GemmConfig(64, 64, 64, 8, 13, 4),
    GemmConfig(128, 64, 64, 8, 8, 4),
)
DECODE_TILES: tuple[tuple[int, int, int, int], ...] = (  # (block_n, block_k, stages, warps)
    (128, 128, 4, 4),
    (64, 256, 4, 4),
    (256, 64, 4, 8),
    (128, 64, 6, 4),
)
INTERPRETER_DECODE_TILES: tuple[tuple[int, int, int, int], ...] = ((32, 16, 1, 4),)

# A split K range is at least this many BLOCK_K steps (a few pipeline stages deep), and a tile
# is split at most this many ways (its last arriver reads every partial back).
MIN_K_STEPS_PER_SPLIT = 4
MAX_SPLIT = 8


@dataclass(frozen=True)
class SplitPlan:
    """How a launch with `split_tail` distributes work over `programs` persistent programs."""

    dp_tiles: int
    """Tiles computed whole: the full waves."""
    tail_tiles: int
    """Tiles of the last, partly filled wave, each split along K."""
    split: int
    """K ranges per tail tile."""
    k_per_split: int
    """BLOCK_K steps per K range (the last may be shorter)."""

    @property
    def units(self) -> int:
        return self.dp_tiles + self.tail_tiles * self.split


def split_plan(num_tiles: int, programs: int, k_steps: int) -> SplitPlan | None:
    """The split of the last wave, or None where splitting would not fill idle programs.

    With T tiles on P programs the last wave holds T mod P tiles (all T when T < P) and leaves
    the rest of the programs idle; splitting each of its tiles `split = P // tail` ways along K
    fills them, when every range keeps >= MIN_K_STEPS_PER_SPLIT steps. A tail of more than
    half the programs is left whole: split into several waves of K ranges it ran slower than
    whole at every shape one H200 timed (512x5120x8192 in 128x256 tiles, 80 tiles 3 ways:
    1.25x the pick's time against 1.16x whole; profiles/h200/NOTES_gemm.md), the fp32
    partials costing more than the shorter wave saved.
    """
    tail = num_tiles % programs if num_tiles >= programs else num_tiles
    if tail == 0:
        return None
    split = min(programs // tail, k_steps // MIN_K_STEPS_PER_SPLIT, MAX_SPLIT)
    if split < 2:
        return None
    k_per_split = -(-k_steps // split)
    split = -(-k_steps // k_per_split)  # no empty ranges
    return SplitPlan(num_tiles - tail, tail, split, k_per_split)


# Safe for the pointer path on any CUDA GPU of the last decade (small shared memory).
FALLBACK_CONFIG = GemmConfig(64, 64, 32, group_m=8, num_stages=3, num_warps=4)


def _next_power_of_two(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def fits_shared_memory(cfg: GemmConfig, in_bytes: int, out_bytes: int, limit_bytes: int) -> bool:
    """The config's pipelined tiles and epilogue staging fit the per-block shared memory."""
    return cfg.shared_memory_bytes(in_bytes, out_bytes) <= limit_bytes


def suits_shape(cfg: GemmConfig, m: int, n: int, k: int) -> bool:
    """No block dimension is more than needed to cover the problem (min 64 rows/cols, 32 K)."""
    return (
        cfg.block_m <= max(64, _next_power_of_two(m))
        and cfg.block_n <= max(64, _next_power_of_two(n))
        and cfg.block_k <= max(32, _next_power_of_two(k))
    )


def splits_here(cfg: GemmConfig, m: int, n: int, k: int, sm_budget: int) -> bool:
    """`split_tail` changes this launch: the last wave is short enough to split."""
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    return split_plan(tiles, sm_budget, -(-k // cfg.block_k)) is not None


def candidate_configs(
    m: int,
    n: int,
    k: int,
    in_bytes: int,
    out_bytes: int,
    *,
    sm_budget: int = SM_COUNT,
    interpreter: bool = False,
    shared_memory_bytes: int = HOPPER_SHARED_MEMORY_BYTES,
    decode_tiles: bool = True,
) -> list[GemmConfig]:
    """The configurations worth timing for one GEMM shape, in the space's order, then (with
    ``decode_tiles``, the persistent kernel's) the weight-stream tiles up to DECODE_MAX_ROWS
    rows (`WEIGHT_STREAM_CONFIGS`) and the swap-AB tiles for few rows (`swap_candidate_configs`).

    Each kept configuration also comes with `split_tail=True` where that changes the launch
    (`split_plan`: a last wave of at most half the programs split along K).
    The split-K decode kernel's configs (`decode_candidate_configs`) are not offered here: on
    one H100 it lost to the persistent kernel at 189 of 190 decode shapes, and do_bench's
    ranking of microsecond kernels picked it where it was slower (profiles/h100/
    NOTES_gemm.md). A tuning-cache entry names it for the shapes where it measured faster.
    """
    space = INTERPRETER_CONFIGS if interpreter else GPU_CONFIGS
    if decode_tiles and not interpreter and m <= DECODE_MAX_ROWS:
        space = space + WEIGHT_STREAM_CONFIGS
    kept = []
    for cfg in space:
        if not suits_shape(cfg, m, n, k):
            continue
        if not interpreter and not fits_shared_memory(
            cfg, in_bytes, out_bytes, shared_memory_bytes
        ):
            continue
        if not cfg.split_tail:
            kept.append(cfg)
        if splits_here(cfg, m, n, k, sm_budget):
            kept.append(replace(cfg, split_tail=True))
    if decode_tiles:
        kept += swap_candidate_configs(
            m,
            n,
            k,
            in_bytes,
            out_bytes,
            sm_budget=sm_budget,
            interpreter=interpreter,
            shared_memory_bytes=shared_memory_bytes,
        )
    kept = list(dict.fromkeys(kept))  # the interpreter space lists a split config itself
    return kept or [space[0] if interpreter else FALLBACK_CONFIG]


def swap_rows(m: int) -> int:
    """The output tile's rows of a swap-AB config for M rows: a power of two, 16 to 64."""
    return min(SWAP_MAX_ROWS, max(16, _next_power_of_two(m)))


def swap_candidate_configs(
    m: int,
    n: int,
    k: int,
    in_bytes: int,
    out_bytes: int,
    *,
    sm_budget: int = SM_COUNT,
    interpreter: bool = False,
    shared_memory_bytes: int = HOPPER_SHARED_MEMORY_BYTES,
) -> list[GemmConfig]:
    """The swap-AB tiles for `[m, k] @ [k, n]` (none above SWAP_MAX_ROWS rows), each with its
    split tail where the tiles leave programs idle (a decode GEMM's usual case), else whole."""
    if m > SWAP_MAX_ROWS:
        return []
    tiles_nk = INTERPRETER_SWAP_TILES if interpreter else SWAP_TILES
    kept = []
    for bn, bk, stages, warps in tiles_nk:
        cfg = GemmConfig(swap_rows(m), bn, bk, 8, stages, warps, swap_ab=True)
        if not suits_shape(cfg, m, n, k):
            continue
        if not interpreter and not fits_shared_memory(
            cfg, in_bytes, out_bytes, shared_memory_bytes
        ):
            continue
        split = replace(cfg, split_tail=True)
        kept.append(split if splits_here(split, m, n, k, sm_budget) else cfg)
    return kept


def decode_splits(tiles: int, k_steps: int, sm_budget: int) -> list[int]:
    """K ranges per tile worth trying when `tiles` tiles of `k_steps` BLOCK_K steps run on
    `sm_budget` programs: the fewest that fill one wave, two waves and four waves of programs
    (units = tiles x split), each range >= 2 steps and at most MAX_SPLIT_K ranges; none where
    one wave is already full."""
    if tiles >= sm_budget:
        return []
    most = min(MAX_SPLIT_K, k_steps // 2)
    splits = []
    for waves in (1, 2, 4):
        split = min(-(-waves * sm_budget // tiles), most)
        if split >= 2:
            splits.append(split)
    return sorted(set(splits))


def decode_candidate_configs(
    m: int,
    n: int,
    k: int,
    in_bytes: int,
    out_bytes: int,
    *,
    sm_budget: int = SM_COUNT,
    interpreter: bool = False,
    shared_memory_bytes: int = HOPPER_SHARED_MEMORY_BYTES,
) -> list[GemmConfig]:
    """The split-K decode kernel's candidates for `[m, k] @ [k, n]` (none above
    DECODE_MAX_ROWS rows): each tile of `DECODE_TILES` at the fewest rows covering M (16-64,
    and 128 from 256 rows), at each split of `decode_splits`."""
    if m > DECODE_MAX_ROWS:
        return []
    if interpreter:
        rows, tiles_nk = [16], INTERPRETER_DECODE_TILES
    else:
        rows = [min(64, max(16, _next_power_of_two(m)))] + ([128] if m >= 256 else [])
        tiles_nk = DECODE_TILES
    kept = []
    for bm in rows:
        for bn, bk, stages, warps in tiles_nk:
            tiles = -(-m // bm) * -(-n // bn)
            for split in decode_splits(tiles, -(-k // bk), sm_budget):
                cfg = GemmConfig(bm, bn, bk, 8, stages, warps, split_k=split)
                if interpreter or fits_shared_memory(cfg, in_bytes, out_bytes, shared_memory_bytes):
                    kept.append(cfg)
    return kept


def heuristic_config(m: int, n: int, k: int, *, interpreter: bool = False) -> GemmConfig:
    """An untuned default: the big Hopper tile for large problems, 64-row tiles for small M."""
    if interpreter:  # 32-wide tiles: still several (and ragged) tiles on the CPU shapes,
        return INTERPRETER_CONFIGS[1]  # and a quarter of the interpreted programs of 16-wide
    if m <= 512:
        return _c(64, 128, 64, 5, 4)
    if m * n <= 2048 * 4096:
        return _c(128, 128, 64, 4, 8)
    return GPU_CONFIGS[0]


def fused_candidate_configs(
    rows: int,
    n: int,
    k: int,
    in_bytes: int,
    out_bytes: int,
    *,
    chunks: int = 1,
    sm_budget: int | None = None,
    shared_memory_bytes: int = HOPPER_SHARED_MEMORY_BYTES,
) -> list[GemmConfig]:
    """The fused GEMM's candidates for ``chunks`` chunks of `rows` rows: the persistent GPU
    space, pruned as `candidate_configs` prunes it, without its decode tiles (swap-AB and
    weight-stream: the persistent kernel's, timed for decode GEMMs only); where chunks are
    few-row (`CHUNK_GROUP_MAX_ROWS`), each also with every chunk in one group
    (`GemmConfig.chunk_group`); and each also with `split_tail` where the launch's tiles
    (every chunk's) leave a short last wave on ``sm_budget`` programs (`split_plan`)."""
    kept = candidate_configs(
        rows,
        n,
        k,
        in_bytes,
        out_bytes,
        sm_budget=1,
        shared_memory_bytes=shared_memory_bytes,
        decode_tiles=False,
    )
    plain = list(dict.fromkeys(replace(cfg, split_tail=False) for cfg in kept))
    if 1 < chunks <= MAX_CHUNK_GROUP and rows <= CHUNK_GROUP_MAX_ROWS:
        plain += [replace(cfg, chunk_group=chunks) for cfg in plain]
    if sm_budget is None:
        return plain
    split = []
    for cfg in plain:
        tiles = chunks * -(-rows // cfg.block_m) * -(-n // cfg.block_n)
        if split_plan(tiles, sm_budget, -(-k // cfg.block_k)) is not None:
            split.append(replace(cfg, split_tail=True))
    return plain + split
