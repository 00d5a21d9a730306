"""Where the lamport1 / lamport2 kernels' workspaces live (``ficco.kernels.allreduce_lamport``).

A workspace is per group (and per rank), grown to the largest call seen and kept: its epochs
advance call by call, so it must outlive every CUDA graph that captured a launch on it (a
grown workspace is a new one; the old ones are kept alive). Growth happens on every rank at
the same call (every rank's calls have the same sizes) and needs a rendezvous, so it is
refused inside a graph capture.

- GPUs, one rank per GPU: PyTorch symmetric memory rendezvoused on the group
  (``symm_mem.empty`` + ``rendezvous``; peers' scratch and flags through ``get_buffer``).
- CPU ranks (gloo) with ficco's shared files (``ficco.execute.cpu.SharedCpuMemory``): every
  rank's scratch and flags are files mapped by every rank, and the kernels run under the
  Triton interpreter, each rank's process spinning on its own flags: the same protocol.

Ranks that share one GPU (``cuda_shared``, CUDA IPC buffers) cannot run these kernels: a
kernel of one process spins on a flag that a kernel of another process must set, and one GPU
runs the two processes' kernels one after the other, not at once (measured on one H100,
torch 2.11: such a spinner saw the flag only after its spin budget ran out, or never), so
every wait only times out. That lane refuses them (``ficco.execute.cuda_shared``).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref

import torch

from ficco.kernels.allreduce_lamport import (
    LamportWorkspace,
    workspace_bytes,
)

#: the smallest capacity (bytes of one scratch row) a workspace is created with
MIN_CAPACITY_BYTES = 1 << 20
#: GPU flag waits give up after this long (the verdict is then a timeout or incorrect, not a
#: hang); CPU ranks' waits keep their backend's flag timeout (``SharedCpuMemory``)
LAMPORT_TIMEOUT_S = 10.0

_CUDA: dict[tuple[str, int], list[LamportWorkspace]] = {}
_CPU: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def row_bytes(kind: str, numel: int, element_size: int, world: int) -> int:
    """Bytes of one scratch row a call needs: the whole input (one-shot) or a slice."""
    from ficco.space.transports import LAMPORT_ONE_SHOT

    rows = numel if kind == LAMPORT_ONE_SHOT else -(-numel // world)
    return rows * element_size


def _capacity(needed: int) -> int:
    return max(MIN_CAPACITY_BYTES, 1 << max(0, needed - 1).bit_length())


def cuda_workspace(group_name: str, needed_bytes: int) -> LamportWorkspace:
    """This rank's workspace on ``group_name``'s ranks (one per GPU), at least
    ``needed_bytes`` per scratch row; created (a rendezvous: every rank at once) on first use
    and when a larger call comes."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    from torch.distributed.distributed_c10d import _resolve_process_group

    device = torch.device("cuda", torch.cuda.current_device())
    key = (group_name, device.index)
    kept = _CUDA.setdefault(key, [])
    if kept and kept[-1].capacity_bytes >= needed_bytes:
        return kept[-1]
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"lamport all-reduce: a call of {needed_bytes} bytes per scratch row needs a larger "
            "workspace, which cannot be made during a CUDA graph capture (run the call once "
            "before capturing)"
        )
    group = _resolve_process_group(group_name)
    world, rank = group.size(), group.rank()
    capacity = _capacity(needed_bytes)
    scratch_bytes, flag_count = workspace_bytes(world, capacity)
    # older torch needs this for a caller's group (the ops); torch 2.11 deprecates it
    with contextlib.suppress(Exception), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(group_name)
    whole = symm_mem.empty(scratch_bytes + 4 * flag_count, dtype=torch.uint8, device=device)
    whole[scratch_bytes:].zero_()  # flags: zero before any peer can write one
    handle = symm_mem.rendezvous(whole, group_name)
    torch.cuda.synchronize()
    dist.barrier(group=group)  # every rank's flags are zero before any rank launches
    scratch = [handle.get_buffer(r, (scratch_bytes,), torch.uint8, 0) for r in range(world)]
    flags = [
        handle.get_buffer(r, (flag_count,), torch.int32, scratch_bytes // 4) for r in range(world)
    ]
    ws = LamportWorkspace(rank, world, capacity, scratch, flags, timeout_s=LAMPORT_TIMEOUT_S)
    ws._keep = (whole, handle)  # the allocation lives as long as the workspace
    kept.append(ws)
    return ws


def shared_file_workspace(shared, world: int, needed_bytes: int) -> LamportWorkspace:
    """This rank's workspace over ficco's CPU shared files (``shared``: a
    ``SharedCpuMemory``, whose ``flag_timeout_s`` its flag waits keep). A new file is zero-filled, so the flags start at zero without a
    reset (a reset after a peer mapped the file could erase its flag)."""
    kept = _CPU.setdefault(shared, [])
    if kept and kept[-1].capacity_bytes >= needed_bytes:
        return kept[-1]
    capacity = _capacity(needed_bytes)
    scratch_bytes, flag_count = workspace_bytes(world, capacity)
    scratch = [
        shared.empty(f"lamport{capacity}-scratch", (scratch_bytes,), torch.uint8, r)
        for r in range(world)
    ]
    flags = [
        shared.empty(f"lamport{capacity}-flags", (flag_count,), torch.int32, r)
        for r in range(world)
    ]
    ws = LamportWorkspace(
        shared.rank, world, capacity, scratch, flags, timeout_s=shared.flag_timeout_s
    )
    kept.append(ws)
    return ws
