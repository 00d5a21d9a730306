"""Backends as registered specs: what ``--backend NAME`` means, found by name.

How to add a backend (at most 3 files):

1. ``ficco/backends/NAME.py``: one ``register_backend(BackendSpec(name="NAME", ...))``: how
   a rank process sets itself up, the GPUs a world needs, how long the pool waits, the sweep
   runner, the default timing, timeout and dtype, whether its timings may be profiles, and
   the capability checks. A variant copies a spec and changes what differs
   (``cuda_shared.py``: ``replace(CUDA, name="cuda_shared", ...)``). Every module of this
   package is imported when the registry is first read, and nothing else lists backends: the
   CLI's ``--backend`` choices and defaults, the API's defaults and checks, the rank, the
   pools and the sweep's runners read them here.
2. ``ficco/execute/NAME.py``: the rank's :class:`ficco.execute.backend.Backend` (buffers,
   reference, the interpreter's primitives, baselines, clock), unless the spec reuses an
   existing one.
3. ``tests/test_backend_NAME.py``: ``ficco.run(problem, backend="NAME")`` verifies schedules.

Registering imports neither torch nor CUDA modules (``import ficco`` and ``ficco recommend``
stay light): a spec's callables import what they run when called.
"""

from __future__ import annotations

import math
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from importlib import import_module
from typing import TYPE_CHECKING

from ficco.execute.options import TimingOptions
from ficco.patterns.spec import Ref
from ficco.problem import DTYPE_BYTES, Problem
from ficco.space import Schedule
from ficco.validate import InputError

if TYPE_CHECKING:
    from ficco.execute.backend import Backend

#: A capability check: None when the backend can run it, else the reason it cannot.
Refusal = str | None

#: The backend of every command and call that runs schedules when none is named (``ficco
#: run``, ``ficco sweep``, ``ficco.run``, ``RunRequest``, ``SweepRequest``), and the one the
#: commands without ``--backend`` describe (its dtype): the GPUs, whose timings are
#: measurements. The CPU harness (``cpu``) is asked for by name.
DEFAULT_BACKEND = "cuda"


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run on this machine."""


def _no_refusal(*_args) -> Refusal:
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendSpec:
    """One backend: every fact about it that code outside its rank primitives reads."""

    name: str
    """The ``--backend`` value (a lowercase identifier)."""
    summary: str
    """One sentence for the CLI's ``--backend`` help."""
    device: str
    """The torch device type its ranks compute on ('cpu' or 'cuda'): what the environment
    fingerprint describes."""
    setup_rank: Callable[[int, int, str | None, float], Backend]
    """``(rank, world, init_file, timeout_s) -> Backend``: set this process up as ``rank`` of
    ``world`` (the rendezvous file, the process group's timeout). Runs in a rank process."""
    gpus: Callable[[int], int]
    """GPUs this machine must have for a world of ``world`` ranks (0: none)."""
    silence_s: Callable[[float], float]
    """The rank pool's patience: seconds without a report before the pool counts as hung,
    given the run's ``timeout_s``."""
    runner: Ref
    """What measures problems for a sweep: a ``Ref`` to a callable ``(options, spec=) ->
    ficco.sweep.runners.Runner`` (``options``: the ranks' ``RunOptions``, None for this
    spec's timeout and timing; ``spec``: this spec) (named, not imported: sweeps sit above
    the backends), which may raise :class:`BackendUnavailable`."""
    timing: TimingOptions
    """How its timed runs are timed unless the caller says otherwise (rounds, warmup, ...)."""
    timeout_s: float
    """Seconds without progress before a problem's ranks count as hung (> 0)."""
    dtype: str
    """The dtype of problems made for it when none is given."""
    run_timed: bool
    """Whether ``ficco.run`` times verified schedules beside the baselines (False: it
    verifies only)."""
    profiles: bool
    """Whether its timings may train or ship a table (False: they exercise the harness)."""
    check: Callable[[Problem, Schedule], Refusal]
    """``(problem, schedule) -> None | reason``: why it cannot run ``schedule`` faithfully.
    Asked before anything runs; a refused schedule is recorded ``unavailable``."""
    check_world: Callable[[int], Refusal] = _no_refusal
    """``world -> None | reason``: why this machine cannot host ``world`` ranks of it; asked
    before any process starts (cheap: no torch)."""
    preload: tuple[str, ...] = ()
    """Modules its ranks import before they are set up. Where given, the rank pool forks
    ranks from a process that imported them once (``ficco.execute.forkserver``); empty
    (CUDA: no device state may cross a fork): every rank starts Python afresh."""
    setup_here: Callable[[int, int, int, float], Backend] | None = None
    """``(rank, local_rank, world, timeout_s) -> Backend``: set this process up as one rank
    of a torchrun launch; None: the backend does not run under torchrun."""

    def __post_init__(self) -> None:
        if not (self.name.isidentifier() and self.name == self.name.lower()):
            raise ValueError(f"name: must be a lowercase identifier, got {self.name!r}")
        for part in fields(self):
            value = getattr(self, part.name)
            if part.name in ("name", "summary", "device", "dtype"):
                if not isinstance(value, str) or not value:
                    raise ValueError(f"{part.name}: backend {self.name} needs a non-empty string")
            elif part.name in ("run_timed", "profiles"):
                if not isinstance(value, bool):
                    raise ValueError(f"{part.name}: backend {self.name} needs True or False")
            elif part.name == "timing":
                if not isinstance(value, TimingOptions):
                    raise ValueError(f"timing: backend {self.name} needs a TimingOptions")
            elif part.name == "timeout_s":
                if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                    raise ValueError(f"timeout_s: backend {self.name} needs seconds > 0")
            elif part.name == "runner":
                if not isinstance(value, Ref):
                    raise ValueError(f"runner: backend {self.name} needs a Ref")
            elif part.name == "preload":
                if not (isinstance(value, tuple) and all(isinstance(m, str) for m in value)):
                    raise ValueError(f"preload: backend {self.name} needs a tuple of module names")
            elif part.name == "setup_here" and value is None:
                continue
            elif not callable(value):
                raise ValueError(
                    f"{part.name}: backend {self.name} needs a callable, got {value!r}"
                )
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device: 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype: one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")


_REGISTRY: dict[str, BackendSpec] = {}
_LOADED = False


def register_backend(spec: BackendSpec) -> BackendSpec:
    """Register ``spec`` under its name; a second spec of the same name is refused."""
    if not isinstance(spec, BackendSpec):
        raise ValueError(f"spec: a BackendSpec, got {type(spec).__name__}")
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"backend: {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def _load() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
            import_module(f"{__name__}.{info.name}")


def registry() -> dict[str, BackendSpec]:
    """Every registered backend by name: cpu, cuda, then the others by name."""
    _load()
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (_ORDER.get(kv[0], len(_ORDER)), kv[0])))


#: The first backends, in the order the CLI lists them; others follow by name.
_ORDER = {"cpu": 0, "cuda": 1}


def backend_names() -> tuple[str, ...]:
    """The ``--backend`` choices."""
    return tuple(registry())


def backend_spec(name: object) -> BackendSpec:
    """The spec called ``name``; InputError naming the choices otherwise. A spec is its own
    answer: a layer handed one passes it down, and a name is looked up once, where it enters."""
    if isinstance(name, BackendSpec):
        return name
    specs = registry()
    if not isinstance(name, str) or name not in specs:
        raise InputError("backend", name, f"must be one of {', '.join(specs)}")
    return specs[name]


def unprofiled(names: Iterable[object]) -> list[str]:
    """The registered backends among ``names`` whose timings may not be profiles."""
    specs = registry()
    return sorted({n for n in names if n in specs and not specs[n].profiles})  # type: ignore[index]
