"""The public Python surface of ficco. The CLI calls only these functions.

Every input is validated here, once: a Python caller gets exactly the refusals, defaults
(``ficco.defaults``) and guards a command-line user gets. A refusal is an
:class:`~ficco.validate.InputError` (a ValueError) naming the field, the value and the rule.
Importing this module loads neither torch nor pandas; each function imports what it runs.

``make_problem``     a Problem from loose inputs (routing as JSON text, dtype by backend)
``schedules``        every legal schedule of a problem
``parse_schedules``  schedule strings, parsed and checked legal for a problem
``run``              run and verify schedules (CPU processes or GPUs), timed on GPUs
                     (:class:`RunRequest`: the problem, its schedules and the ranks' options)
``timing_options``   a backend's default timing with rounds, issue modes, graphs given
``backend_names``    the registered backends (``ficco.backends``)
``workloads``        the problems of real models' layers (optionally a shapes CSV)
``sweep``            measure many problems into a resumable profile store (:class:`SweepRequest`:
                     the problems, the store, and the space, ranks' and strategy's options)
``report``           plots and a summary of a profile store
``train``            fit the selector and write a machine's table
``evaluate``         cross-validate the selector on unseen models, beside the baselines
``recommend``        which schedule to run, from a machine's table
``routed_problem``   an all-to-all problem with its routing described (top-k, skew, seed)
``export``           a machine's table as JSON, CSV rules or a C header

Modules: ``problems`` (problems, schedules, run, timing, a backend's world limit), ``profiles``
(workloads, sweep, report), ``tables`` (train, evaluate, recommend, export).
"""

from __future__ import annotations

from ficco.api.problems import (
    RunRequest,
    check_world,
    default_dtype,
    make_problem,
    parse_schedules,
    run,
    schedules,
    timing_options,
)
from ficco.api.profiles import (
    SweepReport,
    SweepRequest,
    Workloads,
    report,
    skipped_lines,
    sweep,
    sweep_problems,
    workloads,
)
from ficco.api.tables import (
    Exported,
    Trained,
    evaluate,
    export,
    load_frame,
    recommend,
    routed_problem,
    train,
)
from ficco.backends import backend_names
from ficco.validate import InputError

__all__ = [
    "Exported",
    "InputError",
    "RunRequest",
    "SweepReport",
    "SweepRequest",
    "Trained",
    "Workloads",
    "backend_names",
    "check_world",
    "default_dtype",
    "evaluate",
    "export",
    "load_frame",
    "make_problem",
    "parse_schedules",
    "recommend",
    "routed_problem",
    "report",
    "run",
    "schedules",
    "skipped_lines",
    "sweep",
    "sweep_problems",
    "timing_options",
    "train",
    "workloads",
]
