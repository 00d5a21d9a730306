"""Problems, schedules and ``run``: the part of the API every other part builds on."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ficco.validate as validate
from ficco.backends import DEFAULT_BACKEND, BackendSpec, backend_spec
from ficco.defaults import SEED
from ficco.execute.options import GRAPH_MODES, ISSUE_MODES, RunOptions, TimingOptions
from ficco.patterns import problem_field
from ficco.problem import Problem
from ficco.space import Gemm, Schedule, SpaceOptions, Transport, check_legal, enumerate_schedules
from ficco.validate import InputError

EXPORT_FORMATS = ("json", "csv", "header")
GEMMS = tuple(g.value for g in Gemm)
TRANSPORTS = tuple(t.value for t in Transport)

Notify = Callable[[str], None]


def to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


# --- problems and schedules ------------------------------------------------------------------


def default_dtype(backend: str) -> str:
    """The dtype of problems made for ``backend`` when none is given (its spec's: fp32 on
    cpu, where Triton's interpreter is wrong in bf16; bf16 on GPUs)."""
    return backend_spec(backend).dtype


def make_problem(
    pattern: str,
    *,
    m: int | str,
    n: int | str,
    k: int | str,
    world: int | str,
    dtype: str | None = None,
    experts: int | str | None = None,
    routing: str | Sequence[Sequence[int]] | None = None,
    backend: str = DEFAULT_BACKEND,
    a_scale: str | None = None,
    b_scale: str | None = None,
    **pattern_fields: Any,
) -> Problem:
    """A :class:`Problem`; ``routing`` may be JSON text (``'[[3,1],[2,2]]'``); ``dtype`` None
    is :func:`default_dtype` of ``backend``; ``a_scale`` / ``b_scale``: scaled (fp8) dtypes'
    scale granularities (None: per tensor). ``pattern_fields``: the fields patterns declare
    of their own (``ficco.patterns.problem_fields``), as values or command-line text, each
    read by its declaration's ``parse`` (None: not given)."""
    if isinstance(routing, str):
        try:
            routing = json.loads(routing)
        except json.JSONDecodeError as err:
            raise InputError("routing", routing, f"must be JSON ({err})") from None
    # sizes may come as command-line text ("64"); the routing is JSON, typed: a "3" in it is
    # a string where a count belongs, refused by Problem
    sizes = {f: validate.integer(f, v) for f, v in (("m", m), ("n", n), ("k", k), ("world", world))}
    declared = {}
    for name, value in pattern_fields.items():
        read = problem_field(pattern, name)
        if read is None:
            raise TypeError(f"make_problem() got an unexpected keyword argument {name!r}")
        declared[name] = None if value is None else read.parse(value)
    return Problem(
        pattern=pattern,
        **sizes,
        dtype=dtype or default_dtype(backend),
        experts=None if experts is None else validate.integer("experts", experts),
        routing=routing,
        a_scale=a_scale,
        b_scale=b_scale,
        **declared,
    )


def schedules(problem: Problem, options: SpaceOptions | None = None) -> list[Schedule]:
    """Every legal schedule of ``problem`` (serial first)."""
    return list(enumerate_schedules(problem, options))


def parse_schedules(problem: Problem, texts: Iterable[str]) -> list[Schedule]:
    """Parse schedule strings and check each is legal for ``problem`` (InputError otherwise)."""
    if isinstance(texts, str):
        texts = [texts]
    out = []
    for text in texts:
        try:
            schedule = Schedule.parse(text)
        except ValueError as err:
            rule = str(err).removeprefix(f"schedule {text!r}: ")
            raise InputError("schedule", text, rule) from None
        out.append(_legal(problem, schedule))
    return out


def _legal(problem: Problem, schedule: Schedule) -> Schedule:
    if not isinstance(schedule, Schedule):
        raise InputError("schedule", schedule, "must be a ficco.Schedule or its string")
    try:
        return check_legal(problem, schedule)
    except ValueError as err:
        raise InputError("schedule", str(schedule), str(err)) from None


def check_world(world: int, backend: BackendSpec | str) -> None:
    """Refuse a world this machine cannot host on ``backend`` before anything is spawned
    (its spec's ``check_world``: on cpu, at most ``CPU_MAX_WORLD`` ranks that fit in the
    memory available now; GPUs are counted by the executor when it starts)."""
    reason = backend_spec(backend).check_world(world)
    if reason is not None:
        raise InputError("world", world, reason)


# --- run ----------------------------------------------------------------------------------------


def timing_options(
    backend: str,
    *,
    rounds: int | str | None = None,
    issue: Iterable[str] | str = (),
    graphs: str | None = None,
    signatures: bool | None = None,
) -> TimingOptions:
    """``backend``'s default timing (its spec's) with the values given here, each validated
    (InputError naming it): ``rounds`` a count >= 1 or ``"auto"`` (at least 5, then rounds
    until each median's 95% confidence interval is within 2%, at most 50); ``issue`` the
    issue modes, one timing pass each (queued, synced); ``graphs`` which verified schedules
    are captured in CUDA graphs (all, ce, none); ``signatures`` whether each schedule's
    inefficiency signature is measured too. None or empty: the backend's default."""
    spec = backend_spec(backend)
    if spec.device == "cpu":
        # a host clock times synchronously and captures nothing: these would be ignored
        for name, value in (("issue", issue), ("graphs", graphs)):
            if value:
                raise InputError(
                    name,
                    value,
                    f"applies to GPU timing only; the {spec.name} backend's host "
                    "timing is synchronous and captures nothing",
                )
    changes: dict = {}
    if rounds is not None:
        changes["rounds"] = validate.rounds("rounds", rounds)
    if issue:
        changes["issue"] = validate.choices("issue", issue, ISSUE_MODES)
    if graphs is not None:
        changes["graphs"] = validate.choice("graphs", graphs, GRAPH_MODES)
    if signatures is not None:
        changes["signatures"] = validate.flag("signatures", signatures)
    return replace(spec.timing, **changes)


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """One run: schedules of one problem on a backend, and how its ranks run; checked on
    construction (the backend, the seed, the world and memory against this machine, each
    schedule legal), before any rank starts. :meth:`of` builds one from loose values, as the
    CLI gives them; :func:`run` takes it whole."""

    problem: Problem
    schedules: tuple[Schedule, ...] | None = None
    """Legal schedules of ``problem`` (strings are parsed); None: every legal one."""
    backend: str = DEFAULT_BACKEND
    """A registered backend (``ficco.backends``): cpu, W processes over gloo (verifies); cuda,
    W GPUs, verified then timed."""
    options: RunOptions | None = None
    """The ranks' seed of the random inputs, timeout, and timing (its ``timing`` None: verify
    only); None: the backend's timeout, verify only."""
    spec: BackendSpec = field(init=False, repr=False, compare=False)
    """The backend's spec, looked up once here and handed to the layers below."""

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if not isinstance(self.problem, Problem):
            raise InputError("problem", self.problem, "must be a ficco.Problem")
        spec = backend_spec(self.backend)
        set_("spec", spec)
        set_("backend", spec.name)
        options = RunOptions(timeout_s=spec.timeout_s) if self.options is None else self.options
        if not isinstance(options, RunOptions):
            raise InputError("options", options, "must be a ficco.execute.RunOptions")
        validate.integer("seed", options.seed, minimum=0)
        set_("options", options)
        check_world(self.problem.world, spec)
        from ficco.api.checks import check_memory

        check_memory([self.problem], spec)
        if self.schedules is None:
            chosen = schedules(self.problem)
        else:
            given = self.schedules
            chosen = [
                parse_schedules(self.problem, [s])[0]
                if isinstance(s, str)
                else _legal(self.problem, s)
                for s in ([given] if isinstance(given, str | Schedule) else given)
            ]
            if not chosen:
                raise InputError(
                    "schedule", given, "give at least one schedule (None: all of them)"
                )
        set_("schedules", tuple(chosen))

    @classmethod
    def of(
        cls,
        problem: Problem,
        to_run: Iterable[Schedule | str] | None = None,
        *,
        backend: str = DEFAULT_BACKEND,
        seed: int | str = SEED,
        timeout_s: float | str | None = None,
        rounds: int | str | None = None,
        issue: Iterable[str] | str = (),
        graphs: str | None = None,
    ) -> RunRequest:
        """A request from loose values (strings of digits are numbers): the backend's default
        timing with ``rounds``, ``issue`` and ``graphs`` (:func:`timing_options`; no
        signatures) where the backend times its runs, else verify only."""
        if not isinstance(problem, Problem):
            raise InputError("problem", problem, "must be a ficco.Problem")
        timing = timing_options(
            backend, rounds=rounds, issue=issue, graphs=graphs, signatures=False
        )
        spec = backend_spec(backend)
        if not spec.run_timed:
            # a run that only verifies would ignore them
            for name, value in (("rounds", rounds), ("issue", issue), ("graphs", graphs)):
                if value:
                    raise InputError(
                        name, value, f"the {spec.name} backend's runs verify only, untimed"
                    )
        timeout = spec.timeout_s if timeout_s is None else timeout_s
        options = RunOptions(
            seed=validate.integer("seed", seed, minimum=0),
            timeout_s=validate.seconds("timeout_s", timeout),
            timing=timing if spec.run_timed else None,
        )
        return cls(problem=problem, schedules=to_run, backend=spec.name, options=options)


def run(
    problem: Problem | RunRequest,
    to_run: Iterable[Schedule | str] | None = None,
    *,
    backend: str = DEFAULT_BACKEND,
    seed: int = SEED,
    timeout_s: float | None = None,
    rounds: int | str | None = None,
    issue: Sequence[str] = (),
    graphs: str | None = None,
    on_result: Callable | None = None,
):
    """Run and verify schedules of ``problem`` (all legal ones when ``to_run`` is None;
    strings are parsed) on ``backend``; returns one :class:`ficco.execute.ScheduleResult` per
    schedule, in order (``schedule``, ``verdict``, ``max_abs_err``, ``median_ms`` ...), then
    one per baseline where the run was timed. ``on_result`` gets each result once it is final.
    ``problem`` may be a :class:`RunRequest` (the problem, its schedules and the options,
    checked), given alone but for ``on_result``.

    ``cpu``: W processes over gloo, verify only. ``cuda``: W GPUs (spawned here, or this
    process is one rank of a torchrun launch); every schedule verified, then timed with the
    baselines beside it (:func:`timing_options`: ``rounds``, ``issue``, ``graphs``). A
    schedule the backend cannot run is ``unavailable``; one left unfinished by ranks that hung
    or died is ``timeout`` or ``error``. ``timeout_s`` None: the backend's. Works from a plain
    script, a notebook or an interactive session: the ranks are fresh
    ``python -m ficco.execute.rank`` processes that never import the caller's script."""
    if isinstance(problem, RunRequest):
        loose = dict(to_run=to_run, backend=backend, seed=seed, timeout_s=timeout_s)
        loose.update(rounds=rounds, issue=tuple(issue), graphs=graphs)
        unset = dict(to_run=None, backend=DEFAULT_BACKEND, seed=SEED, timeout_s=None)
        unset.update(rounds=None, issue=(), graphs=None)
        given = [name for name, value in loose.items() if value != unset[name]]
        if given:
            raise InputError(
                given[0],
                loose[given[0]],
                "a RunRequest holds the schedules and the options: give it alone (with on_result)",
            )
        request = problem
    else:
        request = RunRequest.of(
            problem,
            to_run,
            backend=backend,
            seed=seed,
            timeout_s=timeout_s,
            rounds=rounds,
            issue=tuple(issue),
            graphs=graphs,
        )
    from ficco.execute.run import run_problem

    return run_problem(
        request.problem,
        request.schedules,
        backend=request.spec,
        options=request.options,
        on_result=on_result,
    )
