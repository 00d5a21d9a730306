"""One rank process: ``python -m ficco.execute.rank --fd N`` (started by ``RankPool``).

Ranks are started as this module, never by re-importing the caller's main script, so a plain
script that calls ``ficco.run`` with no ``if __name__ == "__main__":`` guard works. The pool
hands each rank one end of a private socket pair: first the parent's ``sys.path`` (so the
rank body and any test hook unpickle from the same modules), then ``(body, args)``; the body
is called as ``body(rank, world, init_file, conn, *args)`` and talks over ``conn``.

:func:`serve` is the body of every real rank, of every backend: set up the backend once (its
spec's ``setup_rank``, ``ficco.backends``), then measure the jobs that arrive
(``(tag, Job)``; ``None`` ends) until told to stop. Rank 0 reports
``("ready" | "progress" | "done" | "failed", tag, body)``; a ``failed`` body is
``(verdict, reason)``, the verdict of the exception (``ficco.verdict.classify_failure``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from ficco.backends import backend_spec
from ficco.execute.options import RunOptions, TimingOptions
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.verdict import classify_failure


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """One problem for every rank of a pool."""

    problem: Problem
    schedules: tuple[Schedule, ...]
    seed_offset: int
    timing: TimingOptions | None
    """None: verify only."""
    baselines: bool = True
    plan_hook: object = None
    """A module-level ``Plan -> Plan`` function (fault injection for tests), or None."""


def serve(
    rank: int, world: int, init_file: str, conn: Connection, backend: str, options: RunOptions
) -> None:
    """The body of a pool rank (see the module docstring)."""
    import faulthandler

    from ficco.execute.measure import measure_problem

    # A hang inside CUDA or NCCL shows no Python error: dump every thread's stack to stderr
    # every this many seconds, so the log says where it stuck.
    dump_s = float(os.environ.get("FICCO_HANG_DUMP_S", "0") or 0)
    if dump_s > 0:
        faulthandler.dump_traceback_later(dump_s, repeat=True, file=sys.stderr)
    send = conn.send if rank == 0 else (lambda message: None)
    ranks = backend_spec(backend).setup_rank(rank, world, init_file, options.timeout_s)
    send(("ready", None, {"phase": "init", "name": getattr(ranks, "note", backend)}))
    try:
        while (message := conn.recv()) is not None:
            tag, job = message
            try:
                measured = measure_problem(
                    ranks,
                    job.problem,
                    job.schedules,
                    options.seed + job.seed_offset,
                    job.timing,
                    lambda msg, t=tag: send(("progress", t, msg)),
                    baselines=job.baselines,
                    plan_hook=job.plan_hook,
                )
                send(("done", tag, measured))
            except Exception as err:
                reason = f"{type(err).__name__}: {str(err)[:500]}"
                send(("failed", tag, (classify_failure(err).value, reason)))
                if os.environ.get("FICCO_DEBUG"):
                    traceback.print_exc()
            ranks.after_problem()
    finally:
        with contextlib.suppress(Exception):
            ranks.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ficco.execute.rank")
    parser.add_argument("--fd", type=int, required=True, help="this rank's end of the socket")
    args = parser.parse_args(argv)
    conn = Connection(args.fd)
    for path in reversed(conn.recv()):  # the parent's import path, before any unpickling
        if path not in sys.path:
            sys.path.insert(0, path)
    body, body_args = conn.recv()
    body(*body_args[:3], conn, *body_args[3:])
    # The body closed its process group and answered its last job: end here, without the
    # interpreter's teardown of torch's modules (a second or more of CPU per rank, paid at
    # every pool's close)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
