"""Typed options of a run: how candidates are timed, and how rank processes are run.

Frozen, keyword-only values with one docstring per field; a bad value raises ValueError
naming the field, the value and the rule. Defaults come from ``ficco.defaults``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ficco import defaults
from ficco.space.transports import GRAPH_MODES  # graphs values, beside runs_as_graph

#: ``TimingOptions.issue`` entries
ISSUE_MODES = ("queued", "synced")

Rounds = int | Literal["auto"]


def parse_rounds(text: str | int) -> Rounds:
    """``"auto"`` or a positive round count, from a command line or a config."""
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"rounds: a whole number of rounds or 'auto', got {text!r}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingOptions:
    """How verified candidates are timed (interleaved rounds, ``ficco.execute.timing``)."""

    warmup: int = defaults.WARMUP
    """Untimed runs of each candidate before the rounds."""
    rounds: Rounds = defaults.ROUNDS
    """Interleaved rounds, each timing every candidate once; or ``"auto"``: ``min_rounds``
    rounds, then one more round at a time over the candidates whose median is not yet known
    to ``target_rel_ci``, until ``max_rounds``."""
    min_rounds: int = defaults.AUTO_MIN_ROUNDS
    """``rounds="auto"``: rounds every candidate gets before any is judged."""
    max_rounds: int = defaults.AUTO_MAX_ROUNDS
    """``rounds="auto"``: the cap on any candidate's rounds."""
    target_rel_ci: float = defaults.AUTO_TARGET_REL_CI
    """``rounds="auto"``: stop a candidate once the half-width of its median's confidence
    interval (``ficco.execute.timing.median_ci``) is at most this fraction of its median."""
    confidence: float = defaults.AUTO_CONFIDENCE
    """``rounds="auto"``: coverage of that interval."""
    signatures: bool = False
    """Also time each schedule's GEMM tasks alone, comm tasks alone, and per-task durations
    inside the overlapped run (the inefficiency signature; cuda)."""
    signature_rounds: int = defaults.SIGNATURE_ROUNDS
    """Rounds of each signature part."""
    timeline: bool = False
    """cuda, with ``signatures``: also keep the per-task spans (task, lane, kind, start and
    end in ms) of the signature pass's last held full run in the measurement's
    ``extra['timeline']`` (``ficco.measure.timeline`` reads and draws them)."""
    machine: str | None = None
    """The machine description (a shipped name or a JSON path, ``ficco.model.machines``)
    whose physical floor every timing is held to (``ficco.measure.floor``); None: the
    backend's own (cuda: the shipped description of its GPUs, where one exists)."""
    flush_l2: bool = True
    """cuda: flush the L2 (a 256 MiB write) before each timed iteration."""
    graphs: str = "all"
    """cuda: capture verified schedules into CUDA graphs and time the replays: 'all', 'ce'
    (only copy-engine and symmetric-memory-kernel schedules, whose plans hold no NCCL calls)
    or 'none'. A capture that
    fails falls back to eager issue, recorded in the measurement's ``extra['graph']``."""
    issue: tuple[str, ...] = ("queued",)
    """cuda: how each timed iteration is issued, one timing pass per entry: 'queued' (the
    host runs ahead; issue cost hides behind GPU work) or 'synced' (the host waits for its GPU
    and the ranks meet at a host barrier first; issue cost counts). The first entry fills the
    measurement's median; every entry is kept in ``extra['issue'][mode]``. CPU timing is
    always synchronous."""

    def __post_init__(self) -> None:
        if self.rounds != "auto" and (
            isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1
        ):
            raise ValueError(
                f"rounds: needs at least 1 round, got {self.rounds!r} (or 'auto': until the "
                "median is known to target_rel_ci)"
            )
        if self.warmup < 0:
            raise ValueError(f"warmup: must be >= 0, got {self.warmup}")
        if self.min_rounds < 1:
            raise ValueError(f"min_rounds: needs at least 1 round, got {self.min_rounds}")
        if self.max_rounds < self.min_rounds:
            raise ValueError(
                f"max_rounds: must be >= min_rounds ({self.min_rounds}), got {self.max_rounds}"
            )
        if not 0 < self.target_rel_ci < 1:
            raise ValueError(f"target_rel_ci: must be in (0, 1), got {self.target_rel_ci}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence: must be in [0.5, 1), got {self.confidence}")
        if self.timeline and not self.signatures:
            raise ValueError(
                "timeline: needs signatures=True (the timeline is the last held run of the "
                "signature pass)"
            )
        if self.signature_rounds < 1:
            raise ValueError(f"signature_rounds: needs at least 1, got {self.signature_rounds}")
        if isinstance(self.issue, str):
            raise ValueError(
                f"issue: {self.issue!r} is one string; give a tuple: each entry must be one of "
                f"{ISSUE_MODES}"
            )
        # a list from a caller is taken as the tuple it means; its entries are checked below
        object.__setattr__(self, "issue", tuple(self.issue))
        bad = [mode for mode in self.issue if mode not in ISSUE_MODES]
        if bad or not self.issue:
            raise ValueError(f"issue: {bad or 'empty'}: each entry must be one of {ISSUE_MODES}")
        if self.graphs not in GRAPH_MODES:
            raise ValueError(f"graphs: one of all, ce, none; got {self.graphs!r}")

    @property
    def auto(self) -> bool:
        return self.rounds == "auto"

    @property
    def first_rounds(self) -> int:
        """Rounds every candidate gets before any is judged."""
        return self.min_rounds if self.auto else int(self.rounds)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """How rank processes run a problem."""

    seed: int = defaults.SEED
    """Seed of the random inputs (problem i of a pool run adds i)."""
    timeout_s: float = defaults.TIMEOUT_S
    """Seconds without progress before a rank pool counts as hung (and the process-group
    timeout of its ranks)."""
    startup_s: float = defaults.STARTUP_S
    """Seconds a fresh pool gets before its first report, on top of ``timeout_s``."""
    timing: TimingOptions | None = field(default=None)
    """How verified schedules are timed; None: verify only."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0 seconds, got {self.timeout_s}")
        if self.startup_s < 0:
            raise ValueError(f"startup_s: must be >= 0 seconds, got {self.startup_s}")
        if self.timing is not None and not isinstance(self.timing, TimingOptions):
            raise ValueError(f"timing: a TimingOptions or None, got {type(self.timing).__name__}")
