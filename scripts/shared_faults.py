"""Faults injected into a sweep of ``scripts/gpu_shared.py`` (``Job.plan_hook`` functions).

Each hook rewrites the plans of one target schedule and leaves every other plan as it is, so
one sweep holds the fault and the records around it. Hooks run in the rank processes, which
import this module by name (the driver's ``sys.path`` travels with the pool).
"""

from __future__ import annotations

import dataclasses
import os
import signal

from ficco.plan import Plan, TransferOp

#: the schedule each fault strikes (others pass untouched)
HANG_TARGET = "finer-c2-m/ce/cublas"  # gemm_rs: pushes, each owner waits for its peers'
OOM_TARGET = "shard/ce/cublas"
KILL_TARGET = "finer-c2-m/nccl/cublas"
CORRUPT_TARGET = "finer-c4-m/ce/cublas"


def hang_rank1(plan: Plan) -> Plan:
    """Rank 1 never reaches its transfers: its peers wait for pushes that never come."""
    if str(plan.schedule) != HANG_TARGET or plan.rank != 1:
        return plan
    kept = tuple(t for t in plan.tasks if not isinstance(t.op, TransferOp))
    gone = {t.id for t in plan.tasks} - {t.id for t in kept}
    return dataclasses.replace(
        plan,
        tasks=tuple(
            dataclasses.replace(t, deps=tuple(d for d in t.deps if d not in gone)) for t in kept
        ),
    )


def out_of_memory(plan: Plan) -> Plan:
    """Every rank asks the GPU for 1 TiB while lowering the target: a real CUDA OOM."""
    if str(plan.schedule) == OOM_TARGET:
        import torch

        torch.empty(1 << 40, dtype=torch.uint8, device=torch.cuda.current_device())
    return plan


def kill_rank1(plan: Plan) -> Plan:
    """Rank 1's process dies (SIGKILL) as the target starts, mid-sweep."""
    if str(plan.schedule) == KILL_TARGET and plan.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return plan


def corrupt_chunk(plan: Plan) -> Plan:
    """Every moved chunk lands one row off (a corrupted chunk): verification must fail."""
    if str(plan.schedule) != CORRUPT_TARGET:
        return plan
    tasks = []
    for t in plan.tasks:
        op = t.op
        if isinstance(op, TransferOp) and op.remote.rows[1] - op.remote.rows[0] > 1:
            local, remote = op.local.rows, op.remote.rows
            if op.direction == "recv":  # the received rows start one row late
                local, remote = (local[0], local[1] - 1), (remote[0] + 1, remote[1])
            else:  # the matching send (two-sided transports) sends the same count
                local, remote = (local[0] + 1, local[1]), (remote[0], remote[1] - 1)
            op = dataclasses.replace(
                op,
                local=dataclasses.replace(op.local, rows=local),
                remote=dataclasses.replace(op.remote, rows=remote),
            )
        tasks.append(dataclasses.replace(t, op=op))
    return dataclasses.replace(plan, tasks=tuple(tasks))
