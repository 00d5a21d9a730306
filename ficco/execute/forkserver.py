"""Rank processes forked from a warm process that has already imported what ranks need.

A CPU rank started as ``python -m ficco.execute.rank`` spends about 2 s of CPU on Python's
start and torch's import before it does any work: at W = 8 that is 16 s, paid again by every
fresh pool (a CLI call, a test, a pool a hang killed). A fork server pays it once: it is
``python -m ficco.execute.forkserver`` started with the ranks' environment; it imports the
modules its backend names (``BackendSpec.preload``) and then forks one child per rank asked
for, and the child runs :func:`ficco.execute.rank.main` on the socket it was handed, exactly
as a fresh rank process would.

One server per parent process and environment (variables no rank reads aside: ``UNREAD_ENV``),
so a child never sees modules imported under another environment (Triton reads
``TRITON_INTERPRET`` when a kernel module is imported); each child's environment is then set
to the one its pool asked for. The server is single-threaded (one OpenBLAS thread from numpy
aside, which numpy's own fork handlers stop and restart) and never touches a device, so the
fork is safe; CUDA ranks are not forked (``BackendSpec.preload`` is empty for them). The
server ends when its parent's end of the socket closes.

:class:`ForkedRank` gives the pool the part of :class:`subprocess.Popen` it uses (``pid``,
``poll``, ``wait``, ``kill``); the server reaps its children and hands back their exit codes
(negative: killed by that signal, as ``Popen`` reports).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

from ficco.defaults import USER_DIR_ENV

#: environment variables that change between runs and that no rank reads (pytest's phase
#: marker; the user directory, where the parent writes what the user named no path for)
UNREAD_ENV = frozenset({"PYTEST_CURRENT_TEST", USER_DIR_ENV})
#: the largest request or reply, in bytes (an environment and a few names)
_MESSAGE_BYTES = 1 << 20


def available() -> bool:
    """Whether ranks can be forked here (POSIX fork and descriptor passing)."""
    return hasattr(os, "fork") and hasattr(socket, "send_fds")


class ForkServer:
    """One warm server process; :meth:`fork` makes a rank."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.fileno()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "ficco.execute.forkserver", "--fd", str(fd), *preload],
            pass_fds=(fd,),
            env=env,
        )
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self.owner = os.getpid()  # a process forked from the owner must not share the socket

    def _ask(self, request: tuple, fds: tuple[int, ...] = ()):
        with self._lock:
            socket.send_fds(self._sock, [pickle.dumps(request)], list(fds))
            reply = self._sock.recv(_MESSAGE_BYTES)
        if not reply:
            raise OSError(f"the rank fork server ended (exit code {self._proc.poll()})")
        kind, body = pickle.loads(reply)
        if kind == "error":
            raise OSError(f"the rank fork server failed: {body}")
        return body

    def alive(self) -> bool:
        return self.owner == os.getpid() and self._proc.poll() is None

    def fork(self, fd: int, env: dict[str, str]) -> ForkedRank:
        """A child running ``ficco.execute.rank.main`` on ``fd`` (a copy of it is passed;
        the caller closes its own) with ``env`` as its environment."""
        return ForkedRank(self, self._ask(("fork", env), (fd,)))

    def close(self) -> None:
        self._sock.close()  # the server sees the end and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


class ForkedRank:
    """A rank forked by a :class:`ForkServer`: the ``Popen`` methods the pool uses."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self._server._ask(("poll", self.pid))
            except OSError:  # the server is gone: its children were killed with it
                self.returncode = self._gone()
        return self.returncode

    def _gone(self) -> int | None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return -9
        return None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, 9)


#: the servers of this process, by environment (less UNREAD_ENV) and preloaded modules
_servers: dict[tuple, ForkServer] = {}
_servers_lock = threading.Lock()


def fork_rank(fd: int, env: dict[str, str], preload: tuple[str, ...]) -> ForkedRank:
    """A rank process on ``fd`` with ``env``, forked from this process's server for that
    environment and ``preload`` (started on first use, again if it died)."""
    key = (tuple(sorted((k, v) for k, v in env.items() if k not in UNREAD_ENV)), preload)
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.alive():
            try:
                return server.fork(fd, env)
            except OSError:  # it died just now
                server.close()
        # (a server of the process this one was forked from stays that process's)
        server = _servers[key] = ForkServer(env, preload)
    return server.fork(fd, env)


# --- the server process --------------------------------------------------------------------


def _child(fd: int, env: dict[str, str]) -> None:
    """In the forked child: become the rank (never returns)."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh rank has it
        os.environ.clear()
        os.environ.update(env)
        from ficco.execute.rank import main

        main(["--fd", str(fd)])  # ends the process itself when the body returns
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve(sock: socket.socket) -> None:
    children: dict[int, int | None] = {}  # pid -> exit code once reaped
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 4)
        except OSError:
            return
        if not message:
            return  # the parent closed its end
        kind, body = pickle.loads(message)
        try:
            if kind == "fork":
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    _child(fds[0], body)
                os.close(fds[0])
                children[pid] = None
                reply = ("ok", pid)
            elif kind == "poll":
                if children.get(body) is None:
                    done, status = os.waitpid(body, os.WNOHANG)
                    if done:
                        children[body] = os.waitstatus_to_exitcode(status)
                reply = ("ok", children[body])
            else:
                reply = ("error", f"unknown request {kind!r}")
        except Exception as err:  # answered, so the parent's wait does not hang
            reply = ("error", f"{type(err).__name__}: {err}")
        sock.send(pickle.dumps(reply))


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ficco.execute.forkserver")
    parser.add_argument("--fd", type=int, required=True, help="this server's end of the socket")
    parser.add_argument("preload", nargs="*", help="modules imported before any fork")
    args = parser.parse_args(argv)
    # Ctrl-C reaches the whole process group: the parent decides what ends; the server
    # ends when the parent's end of the socket closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    for name in args.preload:
        importlib.import_module(name)
    _serve(sock)


if __name__ == "__main__":
    main()
