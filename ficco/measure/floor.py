"""The physical floor: the least time a problem can take on a machine, whatever the schedule.

``floor = max(work floor, link floor)`` from the machine description
(``ficco.model.machines``):

- work: a pattern whose work is a GEMM (its spec's ``flops``, every rank's) at the card's
  dense tensor-core peak for the dtype (``tflops``), spread evenly over the W GPUs; a pattern
  whose work is a gather (emb_a2a's pooling, ``flops`` being one addition per gathered
  element) moves ``flops x dtype bytes`` through HBM (``hbm_gbs``), spread evenly;
- link: the bytes the busiest rank receives (the spec's ``comm_bytes``) over every link kind
  of the machine at once, at its ``gbs_per_direction``.

Every figure is a bound no real run beats: the busiest rank does at least the average work,
and no rank receives faster than its links carry. A timing below ``floor x (1 - TOLERANCE)``
by more than its own spread cannot be true: the run skipped work, or the clock lied. Such a
measurement becomes :attr:`~ficco.verdict.Verdict.IMPLAUSIBLE` (:func:`judge_floor`): never
ok, never a profile. A machine without a figure (no ``tflops`` for the dtype) bounds that
side at 0: a looser floor, never a false one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ficco.verdict import Verdict

if TYPE_CHECKING:
    from ficco.measure.record import Measurement
    from ficco.model.machine import Machine
    from ficco.problem import Problem

#: how far below the floor (a fraction of it) a timing may fall before it is implausible,
#: beside its own spread: the vendor peaks are the floor's roofs, so an honest run never gets
#: near; the margin only absorbs clock granularity
TOLERANCE = 0.1
#: ``Measurement.extra`` key of the floor a measurement was held to (ms)
FLOOR_KEY = "floor_ms"


@dataclass(frozen=True, slots=True)
class Floor:
    work_ms: float
    """The GEMM at the card's peak, or the gather through HBM, spread over W GPUs."""
    link_ms: float
    """The busiest rank's received bytes over its links."""
    machine: str

    @property
    def ms(self) -> float:
        return max(self.work_ms, self.link_ms)

    def describe(self) -> str:
        return (
            f"physical floor {self.ms:.4g} ms on {self.machine} (work {self.work_ms:.4g} ms, "
            f"links {self.link_ms:.4g} ms)"
        )


def physical_floor(problem: Problem, machine: Machine) -> Floor:
    """The floor of ``problem`` on ``machine`` (see the module docstring)."""
    from ficco.patterns import spec_of

    spec, w = spec_of(problem.pattern), problem.world
    flops = spec.flops(problem)
    if spec.work_is_gather:
        work = flops * problem.dtype_bytes / w / (machine.hbm_gbs * 1e6)
    else:
        peak = (machine.tflops or {}).get(problem.dtype)
        work = flops / w / (peak * 1e9) if peak else 0.0
    links = sum(link.bytes_per_ms for link in machine.links.values())
    return Floor(work, spec.comm_bytes(problem) / links if w > 1 else 0.0, machine.name)


def below_floor(median_ms: float, spread_ms: float, floor_ms: float) -> bool:
    """Whether a timing is faster than the floor by more than the noise."""
    if not math.isfinite(median_ms) or floor_ms <= 0:
        return False
    spread = spread_ms if math.isfinite(spread_ms) else 0.0
    return median_ms + spread < floor_ms * (1 - TOLERANCE)


def judge_floor(
    measurements: Iterable[Measurement], problem: Problem, machine: Machine | None
) -> list[str]:
    """Hold every timed ok measurement of ``problem`` to its floor on ``machine``: each is
    stamped with ``extra['floor_ms']``; one below it becomes ``implausible``, saying by how
    much. Returns the names made implausible (none without a machine)."""
    if machine is None:
        return []
    floor = physical_floor(problem, machine)
    flagged = []
    for m in measurements:
        if m.verdict != Verdict.OK.value or not math.isfinite(m.median_ms):
            continue
        m.extra[FLOOR_KEY] = floor.ms
        if below_floor(m.median_ms, m.spread_ms, floor.ms):
            m.verdict = Verdict.IMPLAUSIBLE.value
            m.detail = (
                f"timed {m.median_ms:.4g} ms (spread {m.spread_ms:.3g}), below the "
                f"{floor.describe()}: the timed run cannot have done the work"
            )
            flagged.append(m.name)
    return flagged


def machine_for(gpu: str, world: int) -> Machine | None:
    """The shipped description of one node of ``world`` or more GPUs named ``gpu`` (the
    smallest such; None when none is described: no floor is then held)."""
    from ficco.model.machine import load_machine, machine_names

    fits = []
    for name in machine_names():
        machine = load_machine(name)
        if machine.nodes == 1 and machine.gpu.lower() in gpu.lower() and machine.world >= world:
            fits.append(machine)
    return min(fits, key=lambda m: m.world) if fits else None


def resolve_machine(name: str | None) -> Machine | None:
    """A machine description by shipped name or JSON path (None: none)."""
    if name is None:
        return None
    from ficco.model.machine import load_machine

    return load_machine(name)
