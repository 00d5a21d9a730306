"""Drop-in overlapped ops for training and inference runtimes (imports torch).

``all_gather_matmul(a_shard, b, group)``      ``[M/W, K] x [K, N] -> [M, N]``
``matmul_reduce_scatter(a, b, group)``        ``[M, K] x [K, N] -> [M/W, N]``
``matmul_all_reduce(a, b, group)``            ``[M, K] x [K, N] -> [M, N]`` on every rank

Each call picks its schedule for the shape of that call (``ficco.ops.choice``), builds the
plan once per (problem, schedule, rank) and runs it with ficco's one plan interpreter on the
caller's process group (``ficco.ops.runner``). Both are ``torch.library`` custom ops
(``torch.ops.ficco.*``, ``ficco.ops.library``) with fake-tensor implementations, so
``torch.compile`` traces models that call them, and both are differentiable (the backward of
each is the other pattern, through ficco). ``import ficco`` does not load this package.

Per-group state (call plans, CUDA contexts, symmetric buffers) is dropped when its group is
destroyed, or on request: ``ficco.ops.release(group)`` before ``destroy_process_group``.

Modules: ``choice`` (the decision, pure Python), ``cpu`` (the CPU primitives on a caller's
group), ``runner`` (one call), ``library`` (custom ops, fakes, autograd), ``groups`` (per-group caches), ``api``.
"""

from ficco.ops.api import all_gather_matmul, matmul_all_reduce, matmul_reduce_scatter
from ficco.ops.choice import CHECK_ENV, Choice, FallbackWarning, choose
from ficco.ops.groups import release

__all__ = [
    "CHECK_ENV",
    "Choice",
    "FallbackWarning",
    "all_gather_matmul",
    "choose",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
    "release",
]
