"""The timed rounds of a sweep as the host and the GPU see them: the lead an eager candidate finds.

A sweep times its candidates interleaved (A B C A B C ..., ``ficco.execute.timing``) under
queued issue: the host never waits for the GPU inside a round, so when it starts issuing a
candidate the GPU may still hold work queued before it (the earlier candidates, each
iteration's L2 flush and barrier). That backlog ``B`` is the candidate's lead. Per iteration:

- the host issues the flush and the barrier; the backlog grows by their GPU time less their
  issue time, ``lead_ms``: ``B = max(B, 0) + lead_ms``;
- an eager candidate takes ``T = max(gpu, host - B)`` (its issue time shows only where it
  outlasts the lead); a CUDA-graph one takes its GPU time whatever the lead;
- the backlog becomes ``B + T - issue``, ``issue`` being the host's issue time (an eager
  candidate's ``host``; a graph's launch, ``graph_issue_ms``);
- a candidate the model does not cost (``async_tp``, torch's own op) is taken to be host-bound
  (it leaves no backlog).

A candidate timed alone reaches ``B = lead_ms`` when host-bound (each iteration drains what the
one before left) and a growing backlog when GPU-bound, so its time is ``max(gpu, host -
lead_ms)`` either way: what ``predict`` reports for an eager schedule. In a sweep's round the
same schedule can instead find the GPU time of the graph candidates before it (the store's
``shard/nccl`` right after ``shard/ce``: a lead of several hundred microseconds on small
shapes), which is what :func:`round_times` replays to compare with the store.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RoundCandidate:
    """One candidate of a round, as the host and GPU see it."""

    name: str
    gpu_ms: float | None
    """Its GPU time alone (None: not costed; taken to be host-bound, leaving no backlog)."""
    host_ms: float = 0.0
    """An eager candidate's issue time (a graph's is the round's ``graph_issue_ms``)."""
    eager: bool = False


def round_times(
    candidates: list[RoundCandidate], lead_ms: float, graph_issue_ms: float, rounds: int
) -> list[float | None]:
    """Each candidate's median time over ``rounds`` interleaved rounds, starting from an idle
    GPU (the sweep synchronizes after its warm-up); None for a candidate not costed."""
    for name, value in (("lead_ms", lead_ms), ("graph_issue_ms", graph_issue_ms)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}: must be finite and >= 0, got {value}")
    if rounds < 1:
        raise ValueError(f"rounds: must be at least 1, got {rounds}")
    times: list[list[float]] = [[] for _ in candidates]
    backlog = 0.0
    for _ in range(rounds):
        for i, c in enumerate(candidates):
            backlog = max(backlog, 0.0) + lead_ms
            if c.gpu_ms is None:
                backlog = 0.0
                continue
            if c.eager:
                t, issue = max(c.gpu_ms, c.host_ms - backlog), c.host_ms
            else:
                t, issue = c.gpu_ms, graph_issue_ms
            times[i].append(t)
            backlog += t - issue
    return [statistics.median(t) if t else None for t in times]


def alone_ms(gpu_ms: float, host_ms: float, lead_ms: float) -> float:
    """An eager candidate timed alone, round after round (the fixed point above)."""
    return max(gpu_ms, host_ms - lead_ms)
