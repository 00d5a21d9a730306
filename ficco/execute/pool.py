"""The rank pool: W rank processes and their one supervisor, for CPU and GPU alike.

Ranks stay up across problems, so process start, imports and process-group (CUDA, NCCL,
symmetric-memory) set-up are paid once. Each rank is ``python -m ficco.execute.rank`` (a
subprocess, not multiprocessing's spawn: the caller's main script is never re-imported, so
a script with no ``__main__`` guard works), joined to the parent by a private socket pair.

:meth:`RankPool.run` sends one job to every rank and waits for rank 0's answer, reading
progress reports as they come. When no report comes for ``timeout_s`` (a hang) or a rank
dies or fails the job, the job's answer is a :class:`PoolFailure` carrying its verdict
(``timeout`` or ``error``) and reason; after a hang or a death the pool is killed and the
next :meth:`run` starts fresh processes. A fresh pool gets
``startup_s`` more seconds before its first report. ``body`` replaces the rank body
(``ficco.execute.rank.serve``; tests drive the supervision with stand-ins). With ``preload``
(the backend's ``BackendSpec.preload``), ranks are forked from a warm process that imported
those modules (``ficco.execute.forkserver``) instead of each starting Python afresh.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING

from ficco.execute import forkserver
from ficco.execute.options import RunOptions
from ficco.verdict import Verdict

if TYPE_CHECKING:
    from ficco.backends import BackendSpec

#: the CUDA driver's module-loading mode variable; ficco's ranks load eagerly (``_env``)
CUDA_MODULE_LOADING = "CUDA_MODULE_LOADING"


@dataclass(frozen=True, slots=True)
class PoolFailure:
    """Why a job failed as a whole, with the verdict of every schedule it left unfinished:
    ``timeout`` when the ranks went silent, ``error`` when one died, the exception's kind
    (``ficco.verdict.classify_failure``) when one raised outside any schedule. ``str()``
    reads ``"verdict: reason"``."""

    verdict: Verdict
    reason: str

    def __str__(self) -> str:
        return f"{self.verdict.value}: {self.reason}"


class RankPool:
    """``world`` rank processes running ``body(rank, world, init_file, conn, *args)``."""

    def __init__(
        self,
        world: int,
        body: Callable | None = None,
        args: tuple = (),
        *,
        timeout_s: float,
        startup_s: float,
        preload: tuple[str, ...] = (),
    ) -> None:
        if body is None:
            from ficco.execute.rank import serve

            body = serve
        self.world, self.body, self.args = world, body, args
        self.timeout_s, self.startup_s = timeout_s, startup_s
        self.preload = preload if forkserver.available() else ()
        self._procs: list[subprocess.Popen | forkserver.ForkedRank] = []
        self._conns: list[Connection] = []
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._fresh = False
        self._jobs_sent = 0

    @classmethod
    def for_backend(
        cls, spec: BackendSpec, world: int, options: RunOptions, body: Callable | None = None
    ) -> RankPool:
        """A pool of real ranks (``serve``, or ``body``) of the backend ``spec``
        (``ficco.backends``), supervised as it says; GPUs are not counted here
        (``ficco.execute.run.backend_pool`` does). The ranks get its name: each rank process
        looks its spec up again (a spec holds functions, which do not travel)."""
        return cls(
            world,
            body,
            (spec.name, options),
            timeout_s=spec.silence_s(options.timeout_s),
            startup_s=options.startup_s,
            preload=spec.preload,
        )

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="ficco-ranks-")
        init_file = os.path.join(self._tmp.name, "rendezvous")
        self._procs, self._conns = [], []
        env = self._env()
        for rank in range(self.world):
            ours, theirs = socket.socketpair()
            fd = theirs.fileno()
            if self.preload:
                proc = forkserver.fork_rank(fd, env, self.preload)
            else:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "ficco.execute.rank", "--fd", str(fd)],
                    pass_fds=(fd,),
                    env=env,
                )
            theirs.close()
            conn = Connection(ours.detach())
            conn.send(list(sys.path))
            conn.send((self.body, (rank, self.world, init_file, *self.args)))
            self._procs.append(proc)
            self._conns.append(conn)
        self._fresh = True

    @staticmethod
    def _env() -> dict[str, str]:
        """The parent's environment, with the ficco it runs first on the path: the rank
        imports the same copy of ficco (not another one installed, or none) before it has
        the parent's ``sys.path``."""
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        # Every CUDA kernel loaded when its module loads, not at its first launch: a kernel
        # loaded lazily while a fused schedule's flag wait spins blocks the host until the
        # GPU idles, so the producer GEMM behind it is never issued and the wait times out
        # (seen on an H200: a first bf16 add queued behind a FlagWait).
        env[CUDA_MODULE_LOADING] = "EAGER"
        return env

    def _dead(self) -> list[int]:
        return [code for p in self._procs if (code := p.poll()) is not None]

    def run(self, job_of: Callable[[int], object], on_progress: Callable[[dict], None] | None):
        """Send ``job_of(tag)`` to every rank; returns rank 0's ``done`` body, or the
        :class:`PoolFailure` of the job."""
        if self._procs and self._dead():
            self.close(kill=True)  # a rank died after its last answer (a late CUDA error)
        if not self._procs:
            self._start()
        tag = self._jobs_sent
        self._jobs_sent += 1
        job = job_of(tag)
        try:
            for conn in self._conns:
                conn.send((tag, job))
        except OSError:  # BrokenPipeError: a rank died just now; start afresh, once
            self.close(kill=True)
            self._start()
            for conn in self._conns:
                conn.send((tag, job))
        allowance = self.timeout_s + (self.startup_s if self._fresh else 0.0)
        last, last_msg = time.monotonic(), "started"
        live = list(self._conns)
        while True:
            message = None
            for conn in wait(live, timeout=2.0):
                try:
                    message = conn.recv()
                    break
                except (EOFError, OSError):  # that rank is gone: judged below
                    live.remove(conn)
            if message is not None:
                kind, got, body = message
                last, allowance = time.monotonic(), self.timeout_s
                if kind == "ready":
                    self._fresh = False
                    continue
                if got != tag:
                    continue  # a late report of an earlier, abandoned job
                if kind == "progress":
                    last_msg = f"{body.get('phase')} {body.get('name')}"
                    if on_progress:
                        on_progress(body)
                elif kind == "done":
                    return body
                else:  # "failed": the job raised outside any schedule
                    verdict, reason = body
                    return PoolFailure(Verdict(verdict), reason)
                continue
            dead = self._dead()
            if dead:
                failure = PoolFailure(Verdict.ERROR, f"rank process exited with code {dead[0]}")
            elif time.monotonic() - last > allowance:
                failure = PoolFailure(
                    Verdict.TIMEOUT, f"no progress for {allowance:.0f} s after {last_msg}"
                )
            else:
                continue
            self.close(kill=True)
            return failure

    def close(self, kill: bool = False) -> None:
        """Stop the ranks (politely unless ``kill``)."""
        if not kill:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
        for proc in self._procs:
            if not kill:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=20)  # let ranks tear down their groups cleanly
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
