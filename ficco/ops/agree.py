"""Every rank of a group agrees on an op call's operands before any rank runs it.

A rank whose shard has other rows, another K or N, another dtype, schedule or table than its
peers would post other messages than theirs: gloo aborts the process (no Python exception)
and NCCL hangs. So the first call of each call signature on a rank exchanges the signature:
one all-gather of ``FIELDS + W`` int64 per new signature (the runner caches the call's plan
after it, so later calls of the signature pay nothing). A disagreement raises the same
``ValueError`` on every rank, naming the op, every rank's operands and the rule broken.

What a cache cannot see: a rank that repeats an agreed signature while a peer's changes makes
no exchange while the peer does; ``FICCO_OPS_CHECK=1`` exchanges on every call and catches
that too. The exchange also carries a hash of each rank's host name: symmetric memory spans
one host, so a schedule's feasibility depends on how many hosts the group spans.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from functools import cache

import torch
import torch.distributed as dist

#: the ops' names, in the order of their codes on the wire
OPS = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce")
#: the dimensions of ``a`` a signature carries (a [..., K]: leading dimensions flattened)
MAX_DIMS = 6
#: int64 fields before the per-rank counts: op, a's rank and dims, b's dims, dtype,
#: schedule, table, host, the counts' length
FIELDS = 1 + 1 + MAX_DIMS + 2 + 4 + 1


def code(text: str) -> int:
    """A 63-bit hash of ``text`` (the same on every rank and process)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


@cache
def _dtype_names() -> dict[int, str]:
    names = {}
    for value in vars(torch).values():
        if isinstance(value, torch.dtype):
            names[code(str(value))] = str(value).removeprefix("torch.")
    return names


@cache
def host_code() -> int:
    return code(socket.gethostname())


@dataclass(frozen=True, slots=True)
class Signature:
    """What one rank passes to one op call, as its peers must see it."""

    op: str
    a: tuple[int, ...]
    b: tuple[int, ...]
    dtype: int
    """``code(str(dtype))`` of ``a`` (b's is checked against it locally, after agreement)."""
    schedule: int
    table: int
    host: int
    rows: tuple[int, ...]
    """The ``rows`` argument: every rank's size of the sharded first dimension (empty: even)."""

    @classmethod
    def of(cls, op: str, a, b, schedule: str, table: str, rows) -> Signature:
        return cls(
            op, tuple(a.shape), tuple(b.shape), code(str(a.dtype)), code(schedule),
            code(table), host_code(), tuple(rows),
        )  # fmt: skip

    def encode(self, world: int) -> list[int]:
        """``FIELDS + world`` int64: dims beyond ``MAX_DIMS`` fold into the last one carried
        (a product, so a mismatch in them still shows); rows beyond ``world`` are dropped
        (rows of another length than W are refused on every rank after agreement)."""
        dims = list(self.a[: MAX_DIMS - 1])
        if len(self.a) >= MAX_DIMS:
            rest = 1
            for d in self.a[MAX_DIMS - 1 :]:
                rest *= d
            dims.append(rest)
        dims += [-1] * (MAX_DIMS - len(dims))
        b = (list(self.b) + [-1, -1])[:2] if len(self.b) <= 2 else [-2, -2]
        rows = list(self.rows[:world]) + [-1] * max(0, world - len(self.rows))
        return [
            OPS.index(self.op), len(self.a), *dims, *b, self.dtype, self.schedule, self.table,
            self.host, len(self.rows), *rows,
        ]  # fmt: skip

    @classmethod
    def decode(cls, values: list[int], world: int) -> Signature:
        ndim, dims = values[1], values[2 : 2 + MAX_DIMS]
        b = tuple(d for d in values[2 + MAX_DIMS : 4 + MAX_DIMS] if d != -1)
        dtype, schedule, table, host, n_rows = values[4 + MAX_DIMS : FIELDS]
        a = tuple(d for d in dims if d != -1)[:ndim]
        rows = tuple(values[FIELDS : FIELDS + min(n_rows, world)])
        return cls(OPS[values[0]], a, b, dtype, schedule, table, host, rows)

    def shown(self) -> str:
        dtype = _dtype_names().get(self.dtype, "an unknown dtype")
        a_name = "a_shard" if self.op == "all_gather_matmul" else "a"
        rows = f", rows={list(self.rows)}" if self.rows else ""
        return f"{a_name} {list(self.a)}, b {list(self.b)}, {dtype}{rows}"


def exchange(group: dist.ProcessGroup, device: torch.device, values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (one all-gather on ``group``: on ``device``, on the host where
    the group is gloo's)."""
    if "nccl" not in str(dist.get_backend(group)):
        device = torch.device("cpu")
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(group.size())]
    dist.all_gather(every, mine, group=group)
    return [t.tolist() for t in every]


def agree(signature: Signature, group: dist.ProcessGroup, device: torch.device) -> list[Signature]:
    """Every rank's signature of this call; raises on every rank where they disagree."""
    world = group.size()
    every = [Signature.decode(v, world) for v in exchange(group, device, signature.encode(world))]
    broken = disagreement(every)
    if broken:
        listed = "; ".join(f"rank {r}: {s.shown()}" for r, s in enumerate(every))
        raise ValueError(f"{signature.op}: the ranks' operands disagree: {broken} ({listed})")
    return every


def disagreement(every: list[Signature]) -> str | None:
    """The rule the ranks' signatures (``every[r]``: rank r's) break, or None. Rows may
    differ across ranks only in ``all_gather_matmul``'s shard, and only as ``rows`` says."""
    first, world = every[0], len(every)
    ops = [s.op for s in every]
    if len(set(ops)) > 1:
        return (
            f"the ranks called different ops ({ops}): every rank calls a group's ops in one order"
        )
    op = first.op
    differs = lambda field: len({getattr(s, field) for s in every}) > 1  # noqa: E731
    if differs("dtype"):
        return "every rank's a needs one dtype"
    if differs("rows"):
        return f"every rank passes the same rows= (every rank's count), got {[list(s.rows) for s in every]}"
    if op == "all_gather_matmul":
        inner = {(len(s.a), s.a[1:]) for s in every}
        if len(inner) > 1:
            return (
                "every rank's a_shard needs the same dimensions after the first (the one sharded "
                "across ranks), and the same K"
            )
        firsts = [s.a[0] if s.a else 0 for s in every]
        if first.rows and len(first.rows) == world and list(first.rows) != firsts:
            return (
                f"rows={list(first.rows)} gives every rank's size of a_shard's first dimension, "
                f"but the ranks' shards have {firsts}"
            )
        if not first.rows and len(set(firsts)) > 1:
            return (
                f"the ranks' shards have {firsts} rows: shards of different sizes need rows= "
                f"giving every rank's count (here rows={firsts})"
            )
    elif differs("a"):
        what = (
            "M and K"
            if op == "matmul_all_reduce"
            else "all M rows (the reduce-scatter splits them) and K"
        )
        return f"every rank's a needs the same shape: every rank holds {what}"
    if differs("b"):
        return "every rank's b needs the same shape [K, N]"
    if differs("schedule"):
        return "every rank passes the same schedule= (a rank running another posts other messages)"
    if differs("table"):
        return "every rank passes the same table="
    return None


def hosts(every: list[Signature]) -> int:
    """Distinct hosts among the ranks of an agreed call."""
    return len({s.host for s in every})


def agree_decision(op: str, digest: int, shown: str, group, device) -> None:
    """Raise on every rank where the ranks' decisions (``digest``: this rank's, of the problem
    and schedule it chose; ``shown``: that schedule) differ though their operands agree: a
    different table file or ficco version on some rank."""
    every = [v[0] for v in exchange(group, device, [digest])]
    if len(set(every)) != 1:
        raise RuntimeError(
            f"{op}: ranks took different decisions for operands they agree on (this rank "
            f"{shown}, hashes {every}): check that every rank reads the same table and ficco "
            "version"
        )
