"""W rank processes on this machine: spawning, a gloo group per rank, clean-up.

Shared by the CPU executor's runner and the CPU baseline timer. (The GPU pool keeps its ranks
across calls and manages their lifetime itself.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def spawned_ranks(world: int, target: Callable, args: tuple) -> Iterator[list]:
    """Start ``target(rank, world, init_file, *args)`` in ``world`` spawned processes that
    meet through a fresh ``file://`` rendezvous; yields the processes, and joins them (or
    terminates the ones still alive) on exit."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ficco-ranks-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=target, args=(rank, world, init_file, *args), daemon=True)
            for rank in range(world)
        ]
        for proc in procs:
            proc.start()
        try:
            yield procs
        finally:
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.terminate()


def init_gloo_rank(rank: int, world: int, init_file: str, timeout_s: float) -> None:
    """Inside a spawned rank: one CPU thread per rank (W ranks share the cores), Triton's
    interpreter (it must be chosen before Triton is first imported), a gloo group."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
