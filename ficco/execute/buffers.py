"""Tensors behind a plan's buffers: allocation, deterministic random inputs, views.

Inputs are drawn from a generator seeded by (seed, rank, buffer name), so any rank can
regenerate any other rank's inputs to compute a reference without communicating; an input
every rank holds alike (role ``replicated``) is drawn with rank 0's seed on every rank, and a
``constant`` one holds the values its problem defines. A buffer is of the problem's dtype
unless its spec names another (``BufferSpec.dtype``).

What verification reads of a plan's output (:func:`output_of`): the output buffer, or one
tensor per part where the parts differ in dtype, an FP8 part as :class:`Quantized` (its bits
and the scale they are read with).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import zlib
from collections.abc import Iterable
from typing import NamedTuple

import torch

from ficco.patterns import MODULES, spec_of
from ficco.plan import BufferSpec, Plan, Region, build_plan
from ficco.problem import Problem, torch_dtype
from ficco.space import Schedule


def is_fp8(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


#: the byte every fp8 format reads as NaN (0 11111 11 in e5m2, 0 1111 111 in e4m3fn)
FP8_NAN_BYTE = 0x7F


def poison(t: torch.Tensor) -> None:
    """Fill ``t`` with NaN (fp8: through its bytes; no fill kernel is needed for fp8)."""
    if is_fp8(t):
        t.view(torch.uint8).fill_(FP8_NAN_BYTE)
    else:
        t.fill_(float("nan"))


def buffer_dtype(problem: Problem, spec: BufferSpec) -> torch.dtype:
    """The torch dtype of buffer ``spec``: its own, else the problem's."""
    return torch_dtype(spec.dtype or problem.dtype)


def input_seed(seed: int, rank: int, name: str) -> int:
    return (seed * 1_000_003 + rank * 7919 + zlib.crc32(name.encode())) % (2**63)


def source_rank(spec: BufferSpec, rank: int) -> int:
    """The rank whose seed draws input ``spec`` of ``rank``: its own, or rank 0's for an
    input every rank holds alike (role ``replicated``)."""
    return 0 if spec.role == "replicated" else rank


def random_input(shape, dtype: torch.dtype, seed: int, device="cpu") -> torch.Tensor:
    """Standard normal values (never zeros: zeros hide unwritten outputs and run faster)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)


def harness_plan(problem: Problem, rank: int, schedules: Iterable[Schedule] = ()) -> Plan:
    """The plan whose buffers a backend allocates once for every schedule of ``problem``:
    the serial plan's, each peer-visible where any of ``schedules``' plans makes it so (a
    relay's ``a_full``, which its previous rank pushes into). A schedule whose plan cannot
    be built is left out here: it fails with its own verdict when it runs."""
    plan = build_plan(problem, Schedule(), rank)
    visible: set[str] = set()
    for schedule in schedules:
        try:
            visible |= {
                b.name for b in build_plan(problem, schedule, rank).buffers if b.peer_visible
            }
        except Exception:  # noqa: BLE001 - judged when the schedule runs
            continue
    buffers = tuple(
        dataclasses.replace(b, peer_visible=True) if b.name in visible else b for b in plan.buffers
    )
    return dataclasses.replace(plan, buffers=buffers)


def allocate(
    plan: Plan, seed: int, device="cpu", empty=torch.empty, peer_visible_empty=None
) -> dict[str, torch.Tensor]:
    """Inputs filled with random values (integer ``index`` inputs with the problem's own,
    :func:`index_input`); workspaces and outputs poisoned with NaN so an
    unwritten element can never pass verification. ``peer_visible_empty(shape, dtype, device,
    name)`` allocates buffers other ranks access directly (symmetric memory on GPUs, shared
    files on CPU)."""
    tensors = {}
    for spec in plan.buffers:
        if spec.role == "index":
            values = index_input(plan.problem, plan.rank, spec.name)
            tensors[spec.name] = empty(spec.shape, dtype=torch.int64, device=device)
            tensors[spec.name].copy_(values)
            continue
        dtype = buffer_dtype(plan.problem, spec)
        if spec.peer_visible and peer_visible_empty:
            t = peer_visible_empty(spec.shape, dtype=dtype, device=device, name=spec.name)
        else:
            t = empty(spec.shape, dtype=dtype, device=device)
        if spec.role == "constant":
            t.copy_(constant_input(plan.problem, plan.rank, spec.name))
        elif spec.is_input:
            drawn = input_seed(seed, source_rank(spec, plan.rank), spec.name)
            t.copy_(random_input(spec.shape, dtype, drawn, device))
        else:
            poison(t)
        tensors[spec.name] = t
    return tensors


def index_input(problem: Problem, rank: int, name: str) -> torch.Tensor:
    """The values of an integer input (role ``index``, e.g. emb_a2a's bags): the problem's
    own, from its pattern module's ``index_inputs`` (the same for every seed)."""
    module = importlib.import_module(MODULES[problem.pattern])
    return module.index_inputs(problem, rank, name)


def constant_input(problem: Problem, rank: int, name: str) -> torch.Tensor:
    """The values of a ``constant`` input (gemm_ar's FP8 norm scale): the problem's own,
    from its pattern module's ``constant_inputs`` (the same for every seed and rank)."""
    module = importlib.import_module(MODULES[problem.pattern])
    return module.constant_inputs(problem, rank, name)


class Quantized(NamedTuple):
    """An FP8 output part and its per-tensor scale: it stands for ``bits * scale``."""

    bits: torch.Tensor
    scale: torch.Tensor


def output_of(plan: Plan, tensors: dict[str, torch.Tensor]):
    """What verification reads of ``plan``'s output: the output buffer's tensor, or (an
    output of parts, ``Plan.output`` a tuple) a tuple with one per part, an FP8 part as
    :class:`Quantized` with its scale buffer's tensor (``BufferSpec.scale``)."""
    if isinstance(plan.output, str):
        return tensors[plan.output]
    parts = []
    for name in plan.output:
        scale = plan.buffer(name).scale
        parts.append(tensors[name] if scale is None else Quantized(tensors[name], tensors[scale]))
    return tuple(parts)


def poison_output(out) -> None:
    """NaN into an output as :func:`output_of` gives it (its parts' bits; never a scale)."""
    for part in out if isinstance(out, tuple) else (out,):
        poison(part.bits if isinstance(part, Quantized) else part)


def view(tensors: dict[str, torch.Tensor], region: Region) -> torch.Tensor:
    t = tensors[region.buffer]
    if region.index is not None:
        t = t[region.index]
    return t[region.rows[0] : region.rows[1], region.cols[0] : region.cols[1]]


@functools.lru_cache(maxsize=64)
def buffer_shapes(problem: Problem, rank: int) -> dict[str, tuple[int, ...]]:
    """Rank ``rank``'s buffer shapes (its pattern's ``PatternSpec.buffers``): a peer's buffer
    of a name may be larger or smaller than this rank's (emb_a2a's uneven batch)."""
    return {b.name: tuple(b.shape) for b in spec_of(problem.pattern).buffers.load()(problem, rank)}


def peer_shape(problem: Problem, rank: int, peer: int, name: str, own: tuple[int, ...]):
    """The shape to map ``peer``'s buffer ``name`` with, seen from ``rank`` whose own is
    ``own``: the peer's from its pattern where this rank's buffer follows its pattern's shape
    (a buffer allocated otherwise, e.g. packed, keeps ``own``)."""
    if buffer_shapes(problem, rank).get(name) != own:
        return own
    return buffer_shapes(problem, peer)[name]


def symmetric_numel(problem: Problem, name: str, own: tuple[int, ...]) -> int:
    """Elements to allocate for peer-visible buffer ``name`` of shape ``own`` so that every
    rank's allocation has one size: symmetric memory's rendezvous refuses different sizes,
    and a buffer whose shape follows its pattern may differ by rank (emb_a2a's uneven batch).
    The largest over the ranks; a buffer allocated otherwise keeps its own."""
    numel = int(torch.Size(own).numel())
    shapes = [buffer_shapes(problem, r).get(name) for r in range(problem.world)]
    if any(s is None for s in shapes) or own not in shapes:
        return numel
    return max(numel, *(int(torch.Size(s).numel()) for s in shapes))
