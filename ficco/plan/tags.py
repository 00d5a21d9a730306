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
