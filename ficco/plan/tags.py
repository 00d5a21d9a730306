"""Message tags of two-sided transfers: the one place they are derived.

A two-sided transport (gloo, NCCL point-to-point) pairs a send with its receive by tag. Both
ranks derive a transfer's tag from the same (step, chunk), and a rank pool that runs plans
one after another offsets each run's tags by :func:`run_tag`, so a message left behind by a
failed run can never be matched by a later one. Layout, per run (``ficco.defaults``)::

    step * TAG_CHUNK_SLOTS + chunk       transfers, step < TAG_STEP_SLOTS, chunk < TAG_CHUNK_SLOTS
    TAG_STEP_SLOTS * TAG_CHUNK_SLOTS     the run's collectives (all-to-all over point-to-point)

Runs are ``TAGS_PER_RUN`` apart and wrap after ``RUN_SLOTS`` runs, so every tag fits in 31
bits (gloo and NCCL take a signed 32-bit tag).
"""

from __future__ import annotations

from ficco.defaults import TAG_CHUNK_SLOTS, TAG_STEP_SLOTS
from ficco.plan.ops import PUSH, Direction

#: The tag of a run's collectives, above every transfer tag.
COLLECTIVE_TAG = TAG_STEP_SLOTS * TAG_CHUNK_SLOTS
#: Distinct tags one run uses.
TAGS_PER_RUN = COLLECTIVE_TAG + 1
#: Runs before the offsets wrap (a leftover message would have to survive this many runs).
RUN_SLOTS = (1 << 31) // TAGS_PER_RUN


def transfer_tag(step: int, chunk: int) -> int:
    """The tag pairing the two halves of the transfer of (``step``, ``chunk``)."""
    if not 0 <= step < TAG_STEP_SLOTS:
        raise ValueError(f"step: must be in [0, {TAG_STEP_SLOTS}) to get a tag, got {step}")
    if not 0 <= chunk < TAG_CHUNK_SLOTS:
        raise ValueError(f"chunk: must be in [0, {TAG_CHUNK_SLOTS}) to get a tag, got {chunk}")
    return step * TAG_CHUNK_SLOTS + chunk


def run_tag(run: int, tag: int) -> int:
    """``tag`` of a plan, offset for the ``run``-th plan a rank pool runs."""
    if not 0 <= tag < TAGS_PER_RUN:
        raise ValueError(f"tag: must be in [0, {TAGS_PER_RUN}), got {tag}")
    if run < 0:
        raise ValueError(f"run: must be >= 0, got {run}")
    return (run % RUN_SLOTS) * TAGS_PER_RUN + tag


def signal_channel(tag: int, chunks: int) -> int:
    """The signal channel of a transfer's tag, the same on every rank: from the tag's (step,
    chunk) alone. Channels once numbered the tags of each rank's own plan; with a skewed
    routing a rank's plan leaves out empty chunks a peer's has, the two numberings disagreed,
    and a receiver waited on a channel its sender never signalled (a hang at W = 8)."""
    step, chunk = divmod(tag, TAG_CHUNK_SLOTS)
    if chunk >= max(1, chunks):
        raise ValueError(f"tag: chunk {chunk} of tag {tag} is not below the {chunks} chunks")
    return step * max(1, chunks) + chunk


def push_signal_points(plan) -> tuple[frozenset, frozenset]:
    """Which pushed transfers signal their receiver, and which receives wait: one signal per
    (peer, tag), after the last push of that tag to that peer, and one wait, at the first
    receive of it. A chunk may be several pushes under one tag (emb_a2a's batch chunks: a
    run per table); symmetric memory's signal is a 0 -> 1 handshake, so a second signal on
    a channel blocks until the first is consumed, and two ranks whose pushes and receives
    share a stream would each block on the other. Receives of a tag queue on one stream, so
    the wait at the first orders every later one after the signal, which follows every copy."""
    from ficco.plan.ops import TransferGroupOp, TransferOp

    last_push: dict[tuple[int, int], TransferOp] = {}
    first_receive: dict[tuple[int, int], TransferOp] = {}
    for task in plan.tasks:
        # a seg group's pushes signal as a ce push does: its transfers count in plan order
        ops = task.op.transfers if isinstance(task.op, TransferGroupOp) else (task.op,)
        for op in ops:
            if not isinstance(op, TransferOp) or op.initiator != PUSH:
                continue
            if op.direction == Direction.SEND:
                last_push[op.peer, op.tag] = op
            else:
                first_receive.setdefault((op.peer, op.tag), op)
    return frozenset(last_push.values()), frozenset(first_receive.values())
