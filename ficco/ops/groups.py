"""Caches keyed by a process group, and their release when the group is gone.

The ops keep per-group state across calls: call plans, rank contexts (side streams, a
symmetric fence) and symmetric buffers. A group destroyed by ``destroy_process_group`` would
keep all of it alive (and its symmetric memory allocated) for the life of the process, so:

- every cache registers here (:func:`group_cache`), with a function giving the group of an
  entry;
- a cache miss prunes the entries of groups that are no longer registered with
  ``torch.distributed`` (a miss is rare: the first call of a signature), so a long-running
  process that re-creates its groups does not accumulate them;
- :func:`release` drops a group's entries (or every entry) on request, e.g. before
  destroying the group.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch.distributed as dist

_caches: list[tuple[dict, Callable[[Hashable, Any], object]]] = []


def group_cache(group_of: Callable[[Hashable, Any], object]) -> dict:
    """A new cache (a dict) whose entries belong to the group ``group_of(key, value)``."""
    cache: dict = {}
    _caches.append((cache, group_of))
    return cache


def alive(group: object) -> bool:
    """Whether ``group`` is still registered with ``torch.distributed`` (not destroyed)."""
    if not dist.is_available() or not dist.is_initialized():
        return False
    from torch.distributed import distributed_c10d as c10d

    world = getattr(c10d, "_world", None)
    registered = getattr(world, "pg_map", None)
    if registered is None:  # a torch without the registry: never prune what may be alive
        return True
    return group in registered


def prune() -> int:
    """Drop the entries of every destroyed group from every cache; the number dropped."""
    dropped = 0
    for cache, group_of in _caches:
        for key in [k for k, v in cache.items() if not alive(group_of(k, v))]:
            del cache[key]
            dropped += 1
    return dropped


def release(group: dist.ProcessGroup | None = None) -> int:
    """Drop the cached state of ``group`` (every group: None): its call plans, its rank
    context and its symmetric buffers, so their memory is freed once no tensor refers to it.
    Call it on every rank, before destroying the group; a later call on a live group rebuilds
    what it needs (a rendezvous, a collective, on first use). Returns the entries dropped."""
    dropped = 0
    for cache, group_of in _caches:
        for key in [k for k, v in cache.items() if group is None or group_of(k, v) is group]:
            del cache[key]
            dropped += 1
    return dropped
