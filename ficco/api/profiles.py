"""Workloads, sweeps and reports: the profiling part of the API."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ficco.validate as validate
from ficco.api.problems import GEMMS, TRANSPORTS, Notify, check_world, to_stderr
from ficco.backends import DEFAULT_BACKEND, BackendSpec, backend_spec
from ficco.defaults import SEED
from ficco.execute.options import RunOptions, TimingOptions
from ficco.outputs import check_output, make_directory, user_dir
from ficco.problem import DTYPE_BYTES, Problem
from ficco.profile.stores import is_store_url
from ficco.space import Gemm, SpaceOptions, Transport
from ficco.sweep.base import SweepOptions
from ficco.validate import InputError

# --- workloads ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Workloads:
    """The problems of catalog models under one parallel setup."""

    setup: Any
    """The ``ficco.workloads.ParallelSetup``."""
    problems: list[Problem]
    skipped: list[Any]
    """``ficco.workloads.Skipped``: layer x token counts that do not divide over the ranks."""
    duplicates: dict[str, str]
    """``{name@m: earlier name@m}`` of problems with the shape of an earlier one."""
    csv: Path | None = None
    """The shapes CSV written, if one was asked for."""


def _model_names(models: Iterable[str], field_name: str) -> list[str]:
    from ficco.workloads import CATALOG, MODELS

    if isinstance(models, str):
        models = [models]
    models = list(models)
    names = [n.strip().lower() for item in models for n in str(item).split(",") if n.strip()]
    if models and not names:  # '' or ',' names no model; it does not mean all of them
        raise InputError(field_name, models, "names no model; give model names or all")
    if "all" in names:
        return list(MODELS)
    unknown = [n for n in names if n not in CATALOG]
    if unknown:
        raise InputError(
            field_name, unknown, f"unknown model(s) {unknown}; expected {', '.join(CATALOG)} or all"
        )
    return names


def _setup(world: Any, ep: Any, tokens: Iterable[Any], dtype: str, phase: str | None = None):
    from ficco.workloads import DEFAULT_TOKENS, PHASE_TOKENS, ParallelSetup

    tokens = validate.counts("tokens", tokens)
    if phase is not None and phase not in PHASE_TOKENS:
        raise InputError("phase", phase, f"must be one of {', '.join(PHASE_TOKENS)}")
    return ParallelSetup(
        world=validate.integer("world", world, minimum=2, rule="needs at least 2 ranks"),
        ep=None
        if ep is None
        else validate.integer("ep", ep, minimum=2, rule="needs at least 2 ranks"),
        tokens=tokens or (PHASE_TOKENS[phase] if phase else DEFAULT_TOKENS),
        dtype=dtype,
        phase=phase,
    )


def workloads(
    models: Iterable[str] = (),
    *,
    world: int | str = 8,
    ep: int | str | None = None,
    tokens: Iterable[int | str] = (),
    dtype: str = "bf16",
    csv: str | Path | None = None,
    force: bool = False,
    phase: str | None = None,
) -> Workloads:
    """The GEMM + collective problems of catalog models' layers (all models when none are
    named), and the shapes CSV ``ficco sweep --shapes`` reads when ``csv`` is given. With
    ``phase`` ('decode' or 'prefill'): the inference problems, the row-parallel layers as
    gemm_ar at that phase's token counts (``ficco.workloads.PHASE_TOKENS``) unless ``tokens``
    are given."""
    from ficco.workloads import catalog_problems, unique_problems, write_shapes_csv

    names = _model_names(models, "model")
    setup = _setup(world, ep, tokens, dtype, phase)
    target = None if csv is None else check_output("csv", csv, force=validate.flag("force", force))
    problems, skipped = catalog_problems(names or None, setup)
    _, duplicates = unique_problems(problems)
    if target is not None:
        make_directory("csv", target.parent)
        try:
            write_shapes_csv(problems, target)
        except OSError as err:
            raise InputError(
                "csv", str(target), f"cannot be written ({err.strerror or err})"
            ) from None
    return Workloads(
        setup=setup, problems=problems, skipped=skipped, duplicates=duplicates, csv=target
    )


# --- sweep ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SweepRequest:
    """Everything a sweep needs, checked on construction (integers are integers, counts >= 1,
    the store not a shipped directory unless ``force``): which problems (catalog models, or
    a shapes CSV), where their measurements go, and three typed options handed whole to the
    layers below: the schedule space, how the ranks run, how the strategy goes. :meth:`of`
    builds one from loose values, as the CLI gives them."""

    store: str
    """Profile store: a directory (created or resumed), or a database URL."""
    workloads: tuple[str, ...] = ()
    """Catalog models (names, comma-separated names, or 'all'); or give ``shapes``."""
    shapes: str | None = None
    """A shapes CSV (``ficco workloads --csv``)."""
    world: int | None = None
    """Ranks W (needed with ``workloads``; with ``shapes``, keeps only that W)."""
    ep: int | None = None
    tokens: tuple[int, ...] = ()
    dtype: str | None = None
    """None: fp32 on cpu, bf16 on cuda (with ``shapes``: the CSV's)."""
    backend: str = DEFAULT_BACKEND
    strategy: str = "exhaustive"
    space: SpaceOptions = field(default_factory=SpaceOptions)
    """The schedule space swept (``ficco.space.SpaceOptions``: transports, GEMMs, chunk
    counts)."""
    options: RunOptions | None = None
    """How the ranks run: the seed of the random inputs, the timeout, the timing (None, or
    its timing None: the backend's; 3 rounds on cpu, 10 rounds with signatures on cuda). A
    store holds one way of timing: its first issue mode."""
    sweep: SweepOptions = field(default_factory=SweepOptions)
    """How the strategy goes (``ficco.sweep.SweepOptions``: schedules per problem, the time
    limit, optuna's trials, batch, sampler seed and journal)."""
    force: bool = False
    """Allow a store inside ficco's shipped ``profiles/`` (appending to shipped records)."""
    spec: BackendSpec = field(init=False, repr=False, compare=False)
    """The backend's spec, looked up once here and handed to the layers below."""

    def __post_init__(self) -> None:
        spec = backend_spec(self.backend)
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("spec", spec)
        set_("backend", spec.name)
        set_("store", validate.text("store", self.store))
        set_(
            "workloads",
            tuple(self.workloads) if not isinstance(self.workloads, str) else (self.workloads,),
        )
        if self.world is not None:
            set_(
                "world",
                validate.integer("world", self.world, minimum=2, rule="needs at least 2 ranks"),
            )
            check_world(self.world, spec)
        if self.ep is not None:
            set_("ep", validate.integer("ep", self.ep, minimum=2, rule="needs at least 2 ranks"))
        set_("tokens", validate.counts("tokens", self.tokens))
        if self.dtype is not None:
            set_("dtype", validate.choice("dtype", self.dtype, sorted(DTYPE_BYTES)))
        from ficco.sweep import STRATEGIES, SweepOptions

        set_("strategy", validate.choice("strategy", self.strategy, tuple(STRATEGIES)))
        if not isinstance(self.space, SpaceOptions):
            raise InputError("space", self.space, "must be a ficco.space.SpaceOptions")
        options = self.options or RunOptions(timeout_s=spec.timeout_s)
        if not isinstance(options, RunOptions):
            raise InputError("options", options, "must be a ficco.execute.RunOptions")
        validate.integer("seed", options.seed, minimum=0)
        if options.timing is None:  # a sweep times what it verifies
            options = replace(options, timing=spec.timing)
        set_("options", options)
        if not isinstance(self.sweep, SweepOptions):
            raise InputError("sweep", self.sweep, "must be a ficco.sweep.SweepOptions")
        defaults = SweepOptions()
        _optuna_only(
            self.strategy,
            {
                name: getattr(self.sweep, name)
                for name in OPTUNA_FIELDS
                if getattr(self.sweep, name) != getattr(defaults, name)
            },
        )
        set_("force", validate.flag("force", self.force))
        if bool(self.workloads) == bool(self.shapes):
            raise InputError(
                "workloads/shapes",
                (self.workloads, self.shapes),
                "give either --workloads MODEL (one or more) or --shapes FILE.csv",
            )
        if self.workloads and self.world is None:
            raise InputError("world", None, "--workloads needs --world W")
        if self.shapes and self.ep is not None:
            raise InputError(
                "ep", self.ep, "applies to --workloads only (a shapes CSV gives each problem's)"
            )
        if self.shapes is not None and not Path(self.shapes).is_file():
            raise InputError("shapes", self.shapes, "no such file")
        if self.sweep.journal is not None:
            journal = str(check_output("journal", self.sweep.journal, force=self.force))
            set_("sweep", replace(self.sweep, journal=journal))
        if not is_store_url(self.store):
            check_output("store", self.store, force=self.force, directory=True)

    @classmethod
    def of(
        cls,
        *,
        store: str,
        workloads: Iterable[str] | str = (),
        shapes: str | None = None,
        world: int | str | None = None,
        ep: int | str | None = None,
        tokens: Iterable[int | str] = (),
        dtype: str | None = None,
        strategy: str = "exhaustive",
        trials: int | str | None = None,
        trial_fraction: float | str | None = None,
        backend: str = DEFAULT_BACKEND,
        limit_schedules: int | str | None = None,
        gemms: Iterable[str] = (),
        transports: Iterable[str] = (),
        chunks: Iterable[int | str] = (),
        seed: int | str = SEED,
        timeout_s: float | str | None = None,
        timing: TimingOptions | None = None,
        time_limit_s: float | str | None = None,
        batch: int | str | None = None,
        journal: str | None = None,
        force: bool = False,
    ) -> SweepRequest:
        """A request from loose values, as the CLI gives them (strings of digits are numbers):
        ``gemms``, ``transports`` and ``chunks`` (each chunk count >= 2: one chunk is the
        shard schedule) narrow the space; ``seed`` seeds the inputs and optuna's sampler;
        ``timeout_s`` and ``timing`` None: the backend's (``ficco.api.timing_options`` builds
        a timing from loose values); ``trials`` (None: ``trial_fraction`` of the candidates),
        ``trial_fraction``, ``batch`` (None: the sweep's defaults) and ``journal`` apply to
        ``strategy='optuna'`` only; ``limit_schedules`` keeps each problem's first N
        schedules; ``time_limit_s`` starts no new problem after that long."""
        from ficco.sweep import STRATEGIES, SweepOptions

        spec = backend_spec(backend)
        strategy = validate.choice("strategy", strategy, tuple(STRATEGIES))
        optuna = {
            "trials": validate.optional_count("trials", trials),
            "trial_fraction": None
            if trial_fraction is None
            else validate.number("trial_fraction", trial_fraction, above=0, at_most=1),
        }
        limit = validate.optional_count("limit_schedules", limit_schedules)
        space: dict[str, Any] = {}
        if gemms:
            space["gemms"] = tuple(map(Gemm, validate.choices("gemm", gemms, GEMMS)))
        if transports:
            chosen = validate.choices("transport", transports, TRANSPORTS)
            space["transports"] = tuple(map(Transport, chosen))
        if chunks:
            space["chunk_counts"] = validate.counts("chunks", chunks, minimum=2)
        seed = validate.integer("seed", seed, minimum=0)
        timeout = validate.seconds("timeout_s", spec.timeout_s if timeout_s is None else timeout_s)
        timing = spec.timing if timing is None else timing
        if not isinstance(timing, TimingOptions):
            raise InputError("timing", timing, "must be a ficco.execute.TimingOptions")
        limit_s = (
            None
            if time_limit_s is None
            else validate.number("time_limit_s", time_limit_s, at_least=0)
        )
        optuna["batch"] = None if batch is None else validate.count("batch", batch)
        optuna["journal"] = journal
        _optuna_only(strategy, {k: v for k, v in optuna.items() if v is not None})
        # optuna's knobs left out keep SweepOptions' defaults (one definition)
        sweep = SweepOptions(
            limit_schedules=limit,
            seed=seed,
            time_limit_s=limit_s,
            **{k: v for k, v in optuna.items() if v is not None},
        )
        return cls(
            store=store,
            workloads=workloads,
            shapes=shapes,
            world=world,
            ep=ep,
            tokens=tokens,
            dtype=dtype,
            backend=spec.name,
            strategy=strategy,
            space=SpaceOptions(**space),
            options=RunOptions(seed=seed, timeout_s=timeout, timing=timing),
            sweep=sweep,
            force=force,
        )


#: the fields of ``SweepOptions`` that only the optuna strategy reads
OPTUNA_FIELDS = ("trials", "trial_fraction", "batch", "journal")


def _optuna_only(strategy: str, given: dict[str, Any]) -> None:
    """Refuse an optuna option given to another strategy (it would be silently ignored)."""
    if strategy != "optuna" and given:
        name, value = next(iter(given.items()))
        raise InputError(
            name, value, f"applies to --strategy optuna only (this sweep's is {strategy})"
        )


@dataclass(kw_only=True)
class SweepReport:
    """A finished (or time-limited) sweep: the strategy's result and where it was stored."""

    store: str
    result: Any
    """The ``ficco.sweep.SweepResult``."""
    problems: list[Problem] = field(default_factory=list)


#: Triton's CPU interpreter runs about 10 MFLOP/s: past this, a Triton schedule takes minutes
INTERPRETER_WARN_FLOPS = 5e7


def sweep_problems(request: SweepRequest, notify: Notify = to_stderr) -> list[Problem]:
    """The problems ``request`` names (catalog models, or the rows of a shapes CSV)."""
    from ficco.workloads import catalog_problems, read_shapes_csv

    dtype = request.dtype or (None if request.shapes else request.spec.dtype)
    if request.workloads:
        names = _model_names(request.workloads, "workloads")
        problems, skipped = catalog_problems(
            names, _setup(request.world, request.ep, request.tokens, dtype)
        )
        for line in skipped_lines(skipped):
            notify(line)
        return problems
    problems = read_shapes_csv(request.shapes, notify)
    if request.world is not None:
        kept = [p for p in problems if p.world == request.world]
        if len(kept) < len(problems):
            notify(
                f"skipped {len(problems) - len(kept)} shapes of another world than {request.world}"
            )
        problems = kept
    if request.tokens:
        problems = [p for p in problems if p.m in request.tokens]
    if dtype:
        problems = [replace(p, dtype=dtype) for p in problems]
    for p in problems:
        check_world(p.world, request.spec)
    return problems


def skipped_lines(skipped: Sequence[Any]) -> list[str]:
    """One line per reason: the layer x token counts of ``skipped`` it excluded."""
    reasons: dict[str, list[str]] = {}
    for s in skipped:
        reasons.setdefault(s.reason, []).append(f"{s.name}@{s.tokens}")
    out = []
    for reason, names in reasons.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        out.append(f"skipped {shown}: {reason}")
    return out


def sweep(
    request: SweepRequest, *, observer: Any = None, notify: Notify = to_stderr
) -> SweepReport:
    """Measure the problems of ``request`` into its store, resumably (a rerun skips what the
    store holds). Refuses before measuring: a store of another machine or schema, a store
    timed under another ``issue`` mode, a backend this machine lacks. ``observer``: a
    ``ficco.sweep.SweepObserver`` for progress; ``notify`` receives warnings as lines."""
    from ficco.profile import open_store
    from ficco.sweep import make_runner
    from ficco.sweep import sweep as run_sweep

    if not isinstance(request, SweepRequest):
        raise InputError("request", request, "must be a ficco.api.SweepRequest")
    problems = sweep_problems(request, notify)
    if not problems:
        raise InputError(
            "workloads/shapes", request.shapes or request.workloads, "no problems to sweep"
        )
    from ficco.api.checks import check_chunk_counts, check_memory

    check_chunk_counts(problems, request.space)
    sizes_from = "shapes" if request.shapes else ("tokens" if request.tokens else "workloads")
    check_memory(problems, request.spec, sizes_from)
    options = request.sweep if observer is None else replace(request.sweep, observer=observer)
    runner = make_runner(request.spec, request.options)
    if request.spec.device == "cpu" and Gemm.TRITON in request.space.gemms:
        largest = max(problems, key=lambda p: p.flops)
        if largest.flops > INTERPRETER_WARN_FLOPS:
            # without this the sweep looks hung: a Llama-3 8B layer at 64 tokens ran over ten
            # minutes without finishing its first Triton schedule
            notify(
                f"warning: the cpu backend runs Triton GEMMs under Triton's interpreter (about 10 "
                f"MFLOP/s); {largest.name or largest.key} m={largest.m} is "
                f"{largest.flops / 1e6:,.0f} MFLOP, minutes per Triton schedule. Pass --gemm "
                "cublas to leave them out, or sweep smaller shapes."
            )
    with open_store(request.store, runner.fingerprint()) as store:
        location = store.location  # a database URL without its password
        result = run_sweep(
            problems,
            runner=runner,
            store=store,
            strategy=request.strategy,
            space=request.space,
            options=options,
        )
    return SweepReport(store=location, result=result, problems=problems)


def existing_store(store: Any) -> str:
    store = validate.text("store", store)
    if not is_store_url(store) and not Path(store).exists():
        if Path(store).parts[:1] == ("profiles",):
            raise InputError(
                "store",
                store,
                "does not exist here: profiles/ (the measured stores) comes with a checkout "
                "of ficco's repository, not with the installed package; clone the repository "
                "and run from its root, or give your own store",
            )
        raise InputError("store", store, "does not exist")
    return store


def report(
    store: str | Path,
    out: str | Path | None = None,
    *,
    fingerprint: str | None = None,
    force: bool = False,
) -> dict:
    """Plots and ``summary.md`` of a profile store (a directory or a database URL) into ``out``
    (default: the user directory's ``reports/<parent>-<store name>/``, or
    ``reports/<database>/``): each machine (fingerprint) of the store on its own, in a
    directory of plots each and a section of ``summary.md`` each where there are several;
    ``fingerprint`` picks one machine's records. Returns the summary with ``machines`` (per
    fingerprint id), ``files`` (the paths written) and ``out``."""
    from ficco.profile.report import write_report

    store = existing_store(str(store))
    if out is None and is_store_url(store):
        database = store.rstrip("/").rsplit("/", 1)[-1].split("?")[0] or "database"
        out = user_dir() / "reports" / validate.name("store", database)
    elif out is None:
        where = Path(store).resolve()  # e.g. profiles/h200x2/store -> reports/h200x2-store
        out = user_dir() / "reports" / f"{where.parent.name}-{where.name}"
    # summary.md first, so a refusal names a file the report would replace
    check_output("out", Path(out) / "summary.md", force=validate.flag("force", force))
    target = check_output("out", out, force=force, directory=True)
    fp = None if fingerprint is None else validate.text("fingerprint", fingerprint)
    summary = write_report(store, target, fp)
    summary["out"] = str(target)
    return summary
