"""The warp-specialized Gluon GEMM's configurations (`ficco.kernels.gluon_gemm`) and the
shipped per-card picks that `matmul` (16-bit) and `scaled_matmul` (FP8) take it for,
importable without Gluon or a GPU.

A pick (``schedules/<card>/gluon_gemm_picks.json``, keyed as the tuning cache is: card, Triton
version, dtype, shape, SM budget) is a shape where the Gluon kernel ran faster than ficco's
Triton kernel with its shipped configuration (by `PICK_MARGIN`, none), in every benchmark run
it was made from (`scripts/gluon_picks_from_bench.py`). ``FICCO_GEMM_GLUON=0`` turns the picks
off.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from dataclasses import asdict, dataclass, fields

from ficco import validate
from ficco.dtypes import lookup
from ficco.kernels.configs import SplitPlan, split_plan
from ficco.shipped import shipped_dir

PICKS_FILE = "gluon_gemm_picks.json"
PICKS_FORMAT = 1
GLUON_ENV = "FICCO_GEMM_GLUON"
#: how much faster than ficco's Triton kernel, in every run, a shape's Gluon time must be.
#: None: picks from two runs, judged on a third (profiles/h100/NOTES_gemm.md), gave `matmul`
#: 0.9987 / 0.9963 of cuBLAS (full / chunk geomeans) at 0, 0.9953 / 0.9941 at 1%.
PICK_MARGIN = 0.0
#: rows up to which the swap-AB tiles are timed (`GluonGemmConfig.suits`)
SWAP_MAX_ROWS = 64


@dataclass(frozen=True)
class GluonGemmConfig:
    block_m: int
    block_n: int
    block_k: int
    stages: int
    consumers: int  # 1: cooperative, 2: ping-pong (with shared_tile: 2 or 3 row parts)
    consumer_warps: int  # warps of each consumer partition
    split_epilogue: bool = False  # store the main part in two column halves (half the smem)
    # swap-AB (decode rows, 16-bit): out^T [N, M] = b^T [N, K] @ a^T [K, M], so block_m is the
    # weight's columns a tile (wgmma's M, 64) and block_n the rows of `a` (wgmma's N, 16-64):
    # the ring holds the weight's stream, not 64-row A tiles mostly past M
    swap_ab: bool = False
    # the consumers (2 or 3, four warps each) share every tile, each its own 64 rows, with no
    # barrier between them: one 8-warp consumer synchronizes its warpgroups at every ring slot
    # it frees, so FP8's per-step promotion (wait for the step's wgmmas, then add) left the
    # tensor cores idle in both at once; as separate consumers, one's adds run under the
    # others' wgmmas (cuBLASLt's and CUTLASS's cooperative FP8 kernels work this way)
    shared_tile: bool = False
    # the last, partly filled wave's tiles split along K (`configs.split_plan`: stream-K's
    # data-parallel + split tail), each K range's fp32 partial summed by the last to arrive:
    # 192-row tiles run ~1.3x the time of 128-row ones for 1.5x the work (one H200, profiles/h200/NOTES_gemm.md), but
    # on 4096x4096 they are 5.33 waves (704 tiles on 132 SMs) against 7.76; split 3 ways,
    # the last third of a wave costs a third
    split_tail: bool = False

    # A block_n that is no power of two (Gluon's tensors are) runs as two column parts: a
    # main part (the largest power of two below it) and a tail (the rest, itself a power of
    # two), each with its own B tile, accumulator and store. Such widths fill the SMs where
    # power-of-two tiles leave a partial wave: 1024x3072 in 128x192 tiles is 128 tiles.
    @property
    def main_n(self) -> int:
        return 1 << (self.block_n.bit_length() - 1)

    @property
    def tail_n(self) -> int:
        return self.block_n - self.main_n

    @property
    def name(self) -> str:
        if self.shared_tile:
            kind = f"coop{self.consumers}x4"
        else:
            kind = "pp" if self.consumers == 2 else f"coop{self.consumer_warps}"
        kind += "_half" if self.split_epilogue else ""
        kind += "_swap" if self.swap_ab else ""
        kind += "_split" if self.split_tail else ""
        return f"ws_{self.block_m}x{self.block_n}x{self.block_k}_s{self.stages}_{kind}"

    @property
    def rows_per_consumer(self) -> int:
        """The rows of a tile each consumer computes and stores."""
        return self.block_m // self.consumers if self.shared_tile else self.block_m

    def suits(self, m: int) -> bool:
        """Worth timing for M rows: a swap-AB tile only where M fits a few of its row blocks."""
        return not self.swap_ab or m <= SWAP_MAX_ROWS

    def shared_bytes(self, in_bytes: int, out_bytes: int = 2) -> int:
        ring = self.stages * (self.block_m + self.block_n) * self.block_k * in_bytes
        main = self.main_n // (2 if self.split_epilogue else 1)
        # a store buffer per consumer, each the tile's rows (shared tiles: its part of them)
        rows = self.rows_per_consumer
        epilogue = self.consumers * rows * (main + self.tail_n) * out_bytes
        return ring + epilogue + 1024  # barriers and alignment

    def check(self, in_bytes: int, shared_limit: int = 232448) -> None:
        """Refuse a configuration the kernel cannot run, naming the rule."""
        if self.consumers not in (1, 2) and not (self.shared_tile and self.consumers == 3):
            raise ValueError(
                f"consumers={self.consumers}: 1 (cooperative), 2 (ping-pong) or, sharing each "
                "tile, 2 or 3"
            )
        if self.consumers == 2 and self.consumer_warps != 4:
            raise ValueError("ping-pong consumers are one warpgroup each (consumer_warps=4)")
        if self.consumer_warps not in (4, 8):
            raise ValueError(f"consumer_warps={self.consumer_warps}: 4 or 8")
        if self.swap_ab and (
            self.consumers != 1
            or self.consumer_warps != 4
            or self.split_epilogue
            or in_bytes != 2
            or self.block_m != 64
            or self.block_n not in (16, 32, 64)
        ):
            raise ValueError(
                f"{self.name}: a swap-AB tile is one 4-warp consumer, 16-bit inputs, 64 weight "
                "columns by 16, 32 or 64 rows, its epilogue whole"
            )
        if self.shared_tile and (
            self.consumers not in (2, 3)
            or self.consumer_warps != 4
            or self.block_m != 64 * self.consumers
            or self.tail_n
            or self.swap_ab
        ):
            raise ValueError(
                f"{self.name}: a shared tile is 2 or 3 four-warp consumers, each 64 of its rows "
                "(block_m = 64 x consumers), no tail, no swap-AB"
            )
        if self.split_tail and (
            self.swap_ab or self.tail_n or self.rows_per_consumer != 16 * self.consumer_warps
        ):
            raise ValueError(
                f"{self.name}: a split tail takes one accumulator a consumer (no swap-AB, no "
                "tail) of 16 rows a warp (its partials' workspace order)"
            )
        tail = self.tail_n
        if tail and (tail & (tail - 1) or tail < 32):
            raise ValueError(
                f"block_n={self.block_n}: a power of two, or one plus a power-of-two tail of "
                f"at least 32 columns ({self.main_n} + {tail})"
            )
        if tail and in_bytes == 1:
            raise ValueError(f"{self.name}: tiles with a tail take 16-bit inputs only")
        # fp32 accumulator registers per thread of a consumer (setmaxnreg gives a consumer
        # CONSUMER_REGS = 232): 160, cuBLAS's 128x320 cooperative tile, leaves room
        acc_regs = self.rows_per_consumer * self.block_n // (32 * self.consumer_warps)
        if acc_regs > 160:
            raise ValueError(
                f"{self.name}: a {self.block_m}x{self.block_n} fp32 accumulator on "
                f"{self.consumer_warps} warps is {acc_regs} registers a thread (at most 160)"
            )
        need = self.shared_bytes(in_bytes)
        if need > shared_limit:
            raise ValueError(f"{self.name}: {need} bytes of shared memory (at most {shared_limit})")


# the space the benchmark tunes over (shared memory and accumulator registers checked)
BF16_CONFIGS = (
    GluonGemmConfig(128, 128, 64, 4, 2, 4),
    GluonGemmConfig(128, 128, 64, 5, 2, 4, split_epilogue=True),
    GluonGemmConfig(64, 256, 64, 4, 2, 4),
    GluonGemmConfig(128, 256, 64, 3, 1, 8),
    GluonGemmConfig(128, 256, 64, 4, 1, 8, split_epilogue=True),
    GluonGemmConfig(128, 128, 64, 5, 1, 8),
    GluonGemmConfig(128, 128, 64, 6, 1, 8, split_epilogue=True),
    GluonGemmConfig(128, 64, 64, 8, 1, 4),
    # tiles with a tail (main + tail columns) where power-of-two tiles leave SMs idle, with
    # cuBLAS's widths for them (profiles/h200/library_kernels.json): 1024x3072 in 128 tiles of
    # 128x192, 512x5120 in 128 of 64x320, 1024x5120 in 128 of 128x320. 32-deep K steps: a
    # consumer holds two slots (the one its wgmmas read and the one before, released when
    # those retire), so the loads in flight are (stages - 2) steps; halving the step doubles
    # the stages that fit and frees slots sooner (one H200, profiles/h200/NOTES_gemm.md: 1024x3072 38.6 us in
    # 128x192x32 s8, 40.1 in 128x192x64 s4, 51.2 in s3). Tried and never the pick in H200
    # runs on both cards (profiles/*/NOTES_gemm.md): 128x192, 128x320, 64x320 in
    # 64-deep steps, 128x96 tiles (cuBLAS's for 512x3072), 256x160. 64x192 (one warpgroup):
    # 512x3072 in 128 tiles (H200 call AJ0: 25.1 us, cuBLAS 24.7, 128x96 27.6).
    GluonGemmConfig(64, 160, 64, 6, 1, 4),
    GluonGemmConfig(128, 192, 32, 8, 1, 8),
    GluonGemmConfig(128, 320, 32, 6, 1, 8, split_epilogue=True),
    GluonGemmConfig(64, 320, 32, 8, 1, 4, split_epilogue=True),
    GluonGemmConfig(128, 256, 32, 8, 1, 8, split_epilogue=True),
    GluonGemmConfig(128, 128, 32, 10, 2, 4, split_epilogue=True),
    GluonGemmConfig(128, 128, 32, 12, 1, 8, split_epilogue=True),
    GluonGemmConfig(64, 192, 32, 12, 1, 4),
    GluonGemmConfig(64, 192, 64, 6, 1, 4),
    # Decode weights (M <= 512): narrow tiles in deep rings, as cuBLAS streams them (64 weight
    # columns a CTA, 16 stages of 64-deep K steps, profiles/h200/library_kernels_decode_callAL
    # .json): 2880 columns in 45 tiles of 64 or 90 of 32, ~10 K steps of the weight in flight
    # per SM. A 64-row tile at M = 1 reads one row of A (TMA skips the rest) and its wasted
    # wgmma rows cost little beside the weight's stream. The pick at ~100 of 190 decode
    # shapes on either card (profiles/*/NOTES_gemm.md); at M = 128 the better of the Gluon
    # and Triton kernels went from 0.972 of cuBLAS to 0.995.
    GluonGemmConfig(64, 64, 64, 13, 1, 4),
    GluonGemmConfig(64, 64, 128, 6, 1, 4),
    GluonGemmConfig(64, 32, 128, 8, 1, 4),
    GluonGemmConfig(64, 128, 64, 8, 1, 4),
    # Swap-AB decode tiles, cuBLAS's own for M <= 16 on small weights (64x8 / 64x16 tiles in
    # 16 stages of 64-deep steps): 64 weight columns by 16 or 32 rows. The pick at 96 of 190
    # decode shapes on one H200 (profiles/h200/NOTES_gemm.md): 1x4096x2048 11.4 us against cuBLAS's 11.2 (the
    # Triton kernel 12.5, the 64-row Gluon tiles 13.4)
    GluonGemmConfig(64, 16, 64, 16, 1, 4, swap_ab=True),
    GluonGemmConfig(64, 16, 64, 20, 1, 4, swap_ab=True),
    GluonGemmConfig(64, 16, 128, 8, 1, 4, swap_ab=True),
    GluonGemmConfig(64, 32, 64, 12, 1, 4, swap_ab=True),
)
FP8_CONFIGS = (
    GluonGemmConfig(128, 128, 128, 4, 1, 8),
    GluonGemmConfig(128, 128, 128, 5, 1, 8, split_epilogue=True),
    GluonGemmConfig(128, 128, 128, 6, 1, 8, split_epilogue=True),
    GluonGemmConfig(128, 128, 128, 6, 1, 8),
    GluonGemmConfig(64, 128, 128, 8, 2, 4, split_epilogue=True),
    GluonGemmConfig(256, 128, 128, 3, 1, 8),
    GluonGemmConfig(128, 128, 128, 4, 2, 4),
    GluonGemmConfig(64, 128, 128, 6, 2, 4),
    GluonGemmConfig(64, 256, 128, 4, 2, 4, split_epilogue=True),
    # 64-deep K steps and more stages, as the bf16 tiles gained from (loads in flight are
    # stages - 2 steps): promoted by hand after every step, so every 64 products (cuBLASLt:
    # 128). Checked and timed on one H200 (profiles/h200/NOTES_gemm.md): the pick at no shape, kept to rank on
    # the H100.
    GluonGemmConfig(128, 128, 64, 10, 1, 8, split_epilogue=True),
    GluonGemmConfig(128, 128, 64, 12, 1, 8),
    # shared tiles (`shared_tile`): cuBLASLt's promoting tile (128x128x128, 6 stages,
    # cooperative) as two warpgroups that never wait for each other. The pick at 85 of 88
    # shapes on one H200 (profiles/h200/NOTES_gemm.md): Gluon / `_scaled_mm` 0.957 full, 0.969 chunk, from 0.79 /
    # 0.81 with the 8-warp consumer. Tried there and left out: 256x128x128 s3 halves (each
    # 128x128 half promoting inside wgmma, C7514: 0.77 of the pick), 64-deep halves (twice
    # the promotions: 0.73-0.75 of it).
    GluonGemmConfig(128, 128, 128, 6, 2, 4, shared_tile=True),
    GluonGemmConfig(128, 128, 128, 5, 2, 4, split_epilogue=True, shared_tile=True),
    # three row parts: one consumer's promotion stall is covered by two others' wgmmas (the
    # pick at 26 of 40 full shapes on one H200 (profiles/h200/NOTES_gemm.md): 0.999 of `_scaled_mm` full and chunk;
    # halves stay the pick where 192-row tiles leave a partial last wave)
    GluonGemmConfig(192, 128, 128, 5, 3, 4, split_epilogue=True, shared_tile=True),
    GluonGemmConfig(192, 128, 128, 4, 3, 4, shared_tile=True),
    # split tails (`split_tail`): the 192-row tiles where they leave a partial last wave
    # (4096x4096, 2048x8192: 704 tiles, 44 past the fifth wave, split 3 ways), the halves
    # where theirs is under half full (1024x3072: 192 tiles, 60 past the first, split 2).
    # Timed only where the shape's last wave splits; the pick at 9 of 40 full and 11 of 48
    # chunk shapes on one H200 (profiles/h200/NOTES_gemm.md): 2048x8192x14336 1.005 of `_scaled_mm` against 0.936
    # whole (the wave model: 1.125x), 4096x4096x7168 +4%; the fix-up (partials stored, the last
    # arriver summing them) costs a few microseconds, so short K ranges lose (4096x4096x2048)
    GluonGemmConfig(192, 128, 128, 5, 3, 4, split_epilogue=True, shared_tile=True, split_tail=True),
    GluonGemmConfig(192, 128, 128, 4, 3, 4, shared_tile=True, split_tail=True),
    GluonGemmConfig(128, 128, 128, 6, 2, 4, shared_tile=True, split_tail=True),
)


def tail_plan(cfg: GluonGemmConfig, m: int, n: int, k: int, programs: int) -> SplitPlan | None:
    """How a launch of cfg over an M x N x K product on `programs` programs splits its last
    wave (`configs.split_plan`), or None: cfg takes no split tail, or that wave stays whole
    (then the launch is the same as cfg's without `split_tail`)."""
    if not cfg.split_tail:
        return None
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    return split_plan(tiles, programs, -(-k // cfg.block_k))


# the configuration's optional fields (absent: False)
FLAGS = ("split_epilogue", "swap_ab", "shared_tile", "split_tail")
# flags a configuration's JSON form leaves out while False (the picks files written before them
# stay byte for byte what `gluon_picks_from_bench.py` writes)
LATER_FLAGS = ("split_tail",)


def config_from_dict(data: object, in_bytes: int = 2) -> GluonGemmConfig:
    """A configuration from its JSON form for inputs of `in_bytes` (2: 16-bit, 1: FP8),
    refused with the field and the rule."""
    if not isinstance(data, dict):
        raise ValueError(f"config: an object, got {type(data).__name__}")
    names = {f.name for f in fields(GluonGemmConfig)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"config: unknown fields {sorted(unknown)}")
    values = {}
    for f in fields(GluonGemmConfig):
        field = f"config.{f.name}"
        if f.name not in data:
            if f.name in FLAGS:
                continue
            raise validate.InputError(field, None, "missing")
        if f.name in FLAGS:
            values[f.name] = validate.flag(field, data[f.name])
        else:
            values[f.name] = validate.integer(field, data[f.name], minimum=1, text=False)
    cfg = GluonGemmConfig(**values)
    cfg.check(in_bytes)
    return cfg


def key_input_bytes(key: str) -> int:
    """A picks key's input width in bytes, from its dtype field (the tuning cache's spelling:
    `bfloat16`, `float8_e4m3fn`, ...) through ficco's dtype registry."""
    parts = key.split("|")
    if len(parts) != 5:
        raise ValueError(f"key {key!r}: card|triton=V|dtype|m=M,n=N,k=K|sm=S")
    dtype = lookup(parts[2])
    if dtype is None:
        raise ValueError(f"key {key!r}: unknown dtype {parts[2]!r} (ficco.dtypes)")
    return dtype.bytes


def config_to_dict(cfg: GluonGemmConfig) -> dict:
    data = asdict(cfg)
    for flag in LATER_FLAGS:
        if not data[flag]:
            del data[flag]
    return data


@functools.cache
def shipped_picks() -> dict[str, GluonGemmConfig]:
    """Tuning key -> configuration, from every shipped ``<card>/gluon_gemm_picks.json``
    (read once per process). A file that cannot be read is ignored with a warning that
    names it and what is wrong; so is a bad entry."""
    found: dict[str, GluonGemmConfig] = {}
    for path in sorted(shipped_dir("schedules").glob(f"*/{PICKS_FILE}")):
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or data.get("format") != PICKS_FORMAT:
                raise ValueError(f"format: expected {PICKS_FORMAT}")
            picks = data["picks"]
            if not isinstance(picks, dict):
                raise ValueError("picks: an object of tuning key -> entry")
        except (OSError, ValueError, KeyError) as exc:
            warnings.warn(f"ignoring Gluon GEMM picks {path}: {exc}", stacklevel=2)
            continue
        for key, entry in picks.items():
            try:
                if not isinstance(entry, dict):
                    raise ValueError("entry: an object")
                found[key] = config_from_dict(entry.get("config"), key_input_bytes(key))
            except ValueError as exc:
                warnings.warn(f"ignoring Gluon GEMM pick {key!r} in {path}: {exc}", stacklevel=2)
    return found


def picks_enabled() -> bool:
    """``FICCO_GEMM_GLUON``: 1 (the default) takes the picks, 0 keeps Triton's kernels."""
    return validate.choice(GLUON_ENV, os.environ.get(GLUON_ENV, "1"), ("0", "1")) == "1"
