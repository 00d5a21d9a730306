"""A warp-specialized persistent GEMM for Hopper (sm_90), written in Gluon.

Triton's ``tl.dot`` kernels (`persistent`, `scaled`) run one instruction stream per program:
the same warps issue the TMA loads, the wgmmas, the FP8 promotion adds and the epilogue, so a
tile's epilogue and the next tile's first loads wait on each other, and Triton 3.6 cannot
express CUTLASS's ping-pong schedule (profiles/h200/fp8_gemm_notes.md). Gluon, Triton's
lower-level language, places each role in its own warps (the producer and the kernels in
`ficco.kernels.gluon_kernel`, the consumers in `ficco.kernels.gluon_consumer`, their
epilogue in `ficco.kernels.gluon_epilogue`; the launch here):

- a producer warp issues every TMA load of the program's tiles into a ring of ``STAGES``
  shared-memory slots (``ready[s]`` completes when slot s has landed, ``empty[s]`` when its
  consumer's wgmmas have read it);
- ``CONSUMERS`` = 1 (cooperative): one partition of ``CONSUMER_WARPS`` warps runs every tile;
  ``CONSUMERS`` = 2 (ping-pong): two four-warp partitions take alternate tiles, and a turn
  barrier makes each start its K loop only after the other has issued its last wgmma, so one
  runs its epilogue (scales, bf16 store) while the other keeps the tensor cores busy. The
  turns also keep a consumer from waiting on a slot more than one ring pass ahead (an
  mbarrier's phase parity could not tell the passes apart);
- shared tiles (``GluonGemmConfig.shared_tile``, FP8): two or three four-warp consumers take
  every tile, each its own 64 rows (128x128 in halves; 192x128 in thirds, whose A loads as
  three 64-row blocks a slot), and free each ring slot with their own arrivals (the slot's
  ``empty`` counts them). An eight-warp consumer synchronizes its two warpgroups before each
  arrival, so with FP8's promotion by hand (wait for the step's wgmmas, then add) both
  stopped the tensor cores at once; as separate consumers, one's adds run under the others'
  wgmmas (profiles/h200/NOTES_gemm.md: 0.79 of ``_scaled_mm`` with one 8-warp consumer,
  0.96 in halves, 1.00 with thirds: profiles/h200/NOTES_gemm.md);
- a tile ``block_n`` wide that is no power of two (Gluon's tensors are) runs as a main part
  and a tail (128 + 64 = 192, 256 + 64 = 320, 128 + 32 = 160; 16-bit only): each ring slot
  holds the tail's B columns too, each K step issues a second wgmma on the same A slot, and
  the tail is stored through its own buffer. These are cuBLAS's widths for shapes that
  power-of-two tiles fill badly (1024x3072: 128 tiles of 128x192 on 132 SMs, against 192 of
  128x128 or 96 of 128x256);
- swap-AB tiles (decode rows, 16-bit; `ficco.kernels.gluon_swap`): out^T = b^T a^T, the
  weight's 64 columns in wgmma's M and a's 16-32 rows in its N, stored transposed;
- split tail (``GluonGemmConfig.split_tail``, `SplitTail`): the last, partly filled wave's
  tiles in K ranges (`configs.split_plan`), each range's fp32 partial stored in the threads'
  register order, the last range to arrive (a gpu-scope acq_rel ticket) summing them in K
  order (deterministic) before the epilogue;
- fused (FP8, `ws_fused_kernel`, launched by `ficco.kernels.gluon_fused`): the same partitions
  over row chunks that land during the launch, the producer waiting on each chunk's flag
  before reading its rows (`gluon_ring._a_rows`), every tile's rows placed through a chunk
  table (the scale pointers' tuple carries it, so the partitions tell the modes apart).

Tiles go to programs round-robin (tile t on program t mod P, grouped by ``GROUP_M`` rows of
tiles as the persistent kernel groups them). Operands: ``a [M, K]`` row-major; 16-bit ``b``
``[K, N]`` row-major; FP8 ``b`` column-major (its transpose ``[N, K]`` row-major: FP8 wgmma
reads B K-major), with ``a_scale [M]`` (per row) and ``b_scale [N]`` (per column) applied to
the fp32 accumulator before the bf16 store, and partial sums promoted to fp32 every K step
(128 products in 128-deep tiles, cuBLASLt's default accumulation; 64 in 64-deep ones): by
hand after each step's wgmmas retire where the accumulator takes at most 64 registers a
thread, else through wgmma's ``max_num_imprecise_acc``; ``fast_accum`` promotes never
(``use_fast_accum``).

GPU only, written against Triton 3.6's Gluon (the GPU image's; `matmul`'s shipped picks are
keyed on that version). `scripts/bench_gluon_gemm.py` verifies every variant against an fp32
product and times it beside cuBLAS / ``torch._scaled_mm``; what it measured:
profiles/h200/NOTES_gemm.md, profiles/h100/NOTES_gemm.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ficco.kernels.gluon_configs import (  # noqa: F401 - the space, re-exported
    BF16_CONFIGS,
    FP8_CONFIGS,
    GluonGemmConfig,
    tail_plan,
)
from ficco.kernels.gluon_kernel import (  # noqa: F401 - the kernels and their budgets
    CONSUMER_REGS,
    MAX_REGS,
    PRODUCER_REGS,
    PRODUCER_WARPS,
    THIRDS_MAX_REGS,
    ws_fused_kernel,
    ws_gemm_kernel,
)
from ficco.kernels.persistent import _lock_buffer, _tma_operand, default_sm_budget, tma_row_major

_GL_DTYPES = {
    torch.bfloat16: gl.bfloat16,
    torch.float16: gl.float16,
    torch.float8_e4m3fn: gl.float8e4nv,
    torch.float8_e5m2: gl.float8e5,
}


def _desc(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A row-major view's descriptor, with the shape and strides TMA sees (`_tma_operand`:
    a size-1 dimension's unused stride made aligned)."""
    shape, strides, _ = _tma_operand(t)
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype])
    return TensorDescriptor(t, shape, strides, block, layout)


def ws_gemm_launcher(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    cfg: GluonGemmConfig,
    *,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    programs: int | None = None,
    fast_accum: bool = False,
) -> Callable[[], None]:
    """Checks the operands and builds the descriptors once; the returned call launches
    ``out [M, N] = a [M, K] @ b [K, N]`` on the warp-specialized kernel. FP8 operands take
    ``out = (a @ b) * a_scale[:, None] * b_scale[None, :]`` with ``b`` column-major, and
    ``fast_accum`` sums their products without fp32 promotion (as ``use_fast_accum``)."""
    if a.dim() != 2 or b.dim() != 2 or out.dim() != 2:
        raise ValueError("a, b, out: 2-D tensors")
    m, k = a.shape
    k2, n = b.shape
    if k2 != k or tuple(out.shape) != (m, n):
        raise ValueError(f"shapes: a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}")
    if a.dtype not in _GL_DTYPES or b.dtype != a.dtype:
        raise ValueError(
            f"dtypes: a {a.dtype}, b {b.dtype} (one of {sorted(map(str, _GL_DTYPES))})"
        )
    fp8 = a.element_size() == 1
    if fast_accum and not fp8:
        raise ValueError("fast_accum: FP8 inputs only (16-bit products are summed in fp32)")
    if fp8 and out.dtype != torch.bfloat16:
        raise ValueError(f"out: FP8 products are stored bf16, not {out.dtype}")
    if not fp8 and out.dtype != a.dtype:
        raise ValueError(f"out: {out.dtype} for {a.dtype} inputs (the inputs' dtype)")
    cfg.check(a.element_size())
    for name, t in (("a", a), ("out", out)):
        if not tma_row_major(t):
            raise ValueError(f"{name}: a row-major view, 16-byte aligned rows and base (TMA)")
    b_k_major = tma_row_major(b.t())
    if cfg.swap_ab and not tma_row_major(b):
        raise ValueError("b: a swap-AB tile reads a row-major [K, N] b (TMA)")
    if not cfg.swap_ab and (fp8 != b_k_major or (not fp8 and not tma_row_major(b))):
        raise ValueError(
            "b: FP8 wgmma reads B K-major (pass the transpose of a row-major [N, K]); "
            "16-bit b is a row-major [K, N]; 16-byte aligned rows and base (TMA)"
        )
    if fp8 != (a_scale is not None and b_scale is not None):
        raise ValueError("scales: FP8 operands take a_scale [M] and b_scale [N], 16-bit none")
    if fp8 and (
        a_scale.numel() != m
        or b_scale.numel() != n
        or a_scale.dtype != torch.float32
        or b_scale.dtype != torch.float32
    ):
        raise ValueError(f"scales: fp32 a_scale [{m}] and b_scale [{n}]")
    if cfg.swap_ab:
        # out^T [N, M] = b^T [N, K] @ a^T [K, M]: the kernel's A is b's [K, block_m] blocks
        # (read MN-major), its B a's [block_n, K] rows (read K-major), its C out's
        # [block_n, block_m] blocks (stored transposed)
        a_desc = _desc(b, [cfg.block_k, cfg.block_m])
        b_desc = _desc(a, [cfg.block_n, cfg.block_k])
        c_desc = bt_desc = ct_desc = _desc(out, [cfg.block_n, cfg.block_m])
        tiles = triton.cdiv(n, cfg.block_m) * triton.cdiv(m, cfg.block_n)
    else:
        a_desc, b_desc, c_desc, bt_desc, ct_desc = _descs(a, b, out, cfg, b_k_major)
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    if programs is None:
        programs = default_sm_budget(a.device)
    # 16-bit inputs: the scale pointers are never read
    sa = a_scale.reshape(-1) if fp8 else out
    sb = b_scale.reshape(-1) if fp8 else out
    split = SplitTail.of(cfg, m, n, k, programs, out)
    grid = (min(programs, split.units(tiles)),)
    kernel = ws_gemm_kernel[grid]
    max_regs = THIRDS_MAX_REGS if cfg.consumers == 3 else MAX_REGS

    def launch() -> None:
        kernel(
            a_desc, b_desc, c_desc, bt_desc, ct_desc, sa, sb, *split.args(),
            STAGES=cfg.stages, CONSUMERS=cfg.consumers, PRODUCER_REGS=PRODUCER_REGS,
            CONSUMER_REGS=CONSUMER_REGS, FAST_ACCUM=fast_accum, TAIL=cfg.tail_n > 0,
            SWAP_AB=cfg.swap_ab, SPLIT_TAIL=split.plan is not None, num_warps=cfg.consumer_warps,
            maxnreg=max_regs,
        )  # fmt: skip

    return launch


class SplitTail:
    """A launch's split tail (`GluonGemmConfig.split_tail`, `tail_plan`): the plan, the fp32
    partials' workspace [tail tiles, split, block_m, block_n], and the kernel's arguments
    (workspace, arrival counters, whole tiles, K ranges a tail tile, K steps a range). The
    counters are zero between launches (the last arriver resets its own): the launching
    stream's (`persistent._lock_buffer`, read at each launch), or the launch's own
    (`own_counters`: a prepared launch that a CUDA graph may capture)."""

    def __init__(self, plan, workspace: torch.Tensor, counters: int, owned) -> None:
        self.plan = plan
        self.workspace = workspace
        self.counters = counters
        self.owned = owned

    @classmethod
    def of(
        cls, cfg: GluonGemmConfig, m: int, n: int, k: int, programs: int, out: torch.Tensor,
        own_counters: bool = False,
    ) -> SplitTail:  # fmt: skip
        plan = tail_plan(cfg, m, n, k, programs)
        if plan is None:
            return cls(None, out, 0, None)
        workspace = torch.empty(
            max(1, plan.tail_tiles * plan.split * cfg.block_m * cfg.block_n),
            dtype=torch.float32,
            device=out.device,
        )
        # each consumer sharing a tile counts its own rows' K ranges
        counters = plan.tail_tiles * (cfg.block_m // cfg.rows_per_consumer)
        owned = (
            torch.zeros(counters, dtype=torch.int32, device=out.device) if own_counters else None
        )
        return cls(plan, workspace, counters, owned)

    def units(self, tiles: int) -> int:
        """The launch's work units: ``tiles``, or the split's whole tiles and K ranges."""
        return self.plan.units if self.plan else tiles

    def args(self) -> tuple:
        if self.plan is None:  # never read: the kernel compiles without a split tail
            return (self.workspace, self.workspace, 0, 0, 0)
        locks = self.owned
        if locks is None:
            locks = _lock_buffer(self.workspace.device, self.counters)
        plan = self.plan
        return (self.workspace, locks, plan.dp_tiles, plan.split, plan.k_per_split)


def _descs(a, b, out, cfg: GluonGemmConfig, b_k_major: bool) -> tuple:
    """The descriptors of ``out = a @ b`` in cfg's tiles: a, b (K-major for FP8), out, and a
    tail's B columns and store (16-bit only, `GluonGemmConfig.check`; else b's and out's)."""
    # three consumers sharing a tile: A in 64-row blocks (192 is no power of two)
    a_rows = cfg.rows_per_consumer if cfg.consumers == 3 else cfg.block_m
    a_desc = _desc(a, [a_rows, cfg.block_k])
    if b_k_major:
        b_desc = _desc(b.t(), [cfg.block_n, cfg.block_k])
    else:
        b_desc = _desc(b, [cfg.block_k, cfg.main_n])
    # each consumer stores its own rows: with shared tiles, its part of the tile's
    c_desc = _desc(out, [cfg.rows_per_consumer, cfg.main_n // (2 if cfg.split_epilogue else 1)])
    bt_desc = _desc(b, [cfg.block_k, cfg.tail_n]) if cfg.tail_n else b_desc
    ct_desc = _desc(out, [cfg.block_m, cfg.tail_n]) if cfg.tail_n else c_desc
    return a_desc, b_desc, c_desc, bt_desc, ct_desc


def ws_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    cfg: GluonGemmConfig,
    *,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    programs: int | None = None,
    fast_accum: bool = False,
) -> torch.Tensor:
    """``ws_gemm_launcher``'s launch, once; returns ``out``."""
    ws_gemm_launcher(
        a, b, out, cfg, a_scale=a_scale, b_scale=b_scale, programs=programs, fast_accum=fast_accum
    )()
    return out
