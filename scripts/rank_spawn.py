"""W rank processes for a benchmark script, and the JSON rank 0 leaves for the parent.

``rank_main(rank, world, init_file, config, result_file)`` runs in each rank; rank 0 writes
its result to ``result_file`` (JSON), which ``spawn_ranks`` returns once every rank ended.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def spawn_ranks(rank_main, world: int, config: dict):
    """Run ``rank_main`` on ``world`` spawned processes; rank 0's JSON result."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        result_file = os.path.join(tmp, "result.json")
        rendezvous = os.path.join(tmp, "rendezvous")
        mp.spawn(rank_main, (world, rendezvous, config, result_file), nprocs=world, join=True)
        return json.loads(Path(result_file).read_text())


def end_rank(cuda: bool) -> None:
    """End a rank whose work is done on every rank (after a final barrier): NCCL groups are
    destroyed; gloo ranks leave without its teardown, which can abort a process under load."""
    import torch.distributed as dist

    if cuda:
        dist.destroy_process_group()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
