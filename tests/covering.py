"""A covering set of schedules, defined once for the CPU verification tests
(``tests/test_execute_cpu.py``, ``tests/test_fp8_cpu.py``): few schedules that together take
every value of every named axis that occurs among the given ones.

Greedy set cover: each pick is the schedule taking the most values not yet taken, per unit of
its cost; ties go to the earlier schedule (the space's order). A Triton GEMM costs more than
cuBLAS's (on CPU it runs under Triton's interpreter, seconds a schedule), so the Triton axis
values (``gemm``, the fused kernel) are taken by as few schedules as can take them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ficco.space import Gemm, Schedule

#: what one schedule costs to run, relative to a cuBLAS one (Triton: the CPU interpreter)
TRITON_COST = 4


def cost(s: Schedule) -> int:
    return TRITON_COST if s.gemm is Gemm.TRITON else 1


def covering(
    schedules: Iterable[Schedule], axes: Sequence[str], first: Schedule | None = None
) -> list[Schedule]:
    """Schedules of ``schedules`` that together take every value of every axis of ``axes``
    that occurs among them, in the order given; ``first`` (one of them, e.g. the serial
    schedule) is always among them."""
    pool = list(dict.fromkeys(schedules))
    order = {s: i for i, s in enumerate(pool)}

    def values(s: Schedule) -> frozenset:
        return frozenset((axis, getattr(s, axis)) for axis in axes)

    wanted = frozenset().union(*map(values, pool))
    chosen = [first] if first is not None and first in pool else []
    taken = frozenset().union(*map(values, chosen))
    while taken != wanted:
        best = max(pool, key=lambda s: (len(values(s) - taken) / cost(s), -order[s]))
        chosen.append(best)
        taken |= values(best)
    return sorted(chosen, key=order.__getitem__)
