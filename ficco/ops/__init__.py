"""Drop-in overlapped ops for training and inference runtimes (imports torch).

``all_gather_matmul(a_shard, b, group)``      ``[S, ..., K] x [K, N] -> [W*S, ..., N]``
``matmul_reduce_scatter(a, b, group)``        ``[M, ..., K] x [K, N] -> [M/W, ..., N]``
``matmul_all_reduce(a, b, group)``            ``[..., K] x [K, N] -> [..., N]`` on every rank
``all_gather_linear``, ``linear_reduce_scatter``, ``linear_all_reduce``: the same with a
``torch.nn.Linear`` weight ``[out, in]`` (and an optional bias).
``all_reduce_add_rms_norm(t, residual, norm_weight, group)`` -> ``(normed, new_residual)``:
the all-reduce fused with the residual add and RMSNorm (``linear_all_reduce(...,
residual=, norm_weight=)`` runs its linear into it; ``ficco.ops.norm``).

Each call picks its schedule for the shape of that call (``ficco.ops.choice``) once the
group's ranks agree on the call's operands (``ficco.ops.agree``), builds the plan once per
(problem, schedule, rank) and runs it with ficco's one plan interpreter on the caller's
process group (``ficco.ops.runner``). They are ``torch.library`` custom ops
(``torch.ops.ficco.*``, ``ficco.ops.library``) with fake-tensor implementations, so
``torch.compile`` traces models that call them, and differentiable (the backward of each
sharded one is the other pattern, through ficco). ``import ficco`` does not load this
package. ``schedule_counts()`` says which schedule every call ran, and why
(``ficco.ops.observe``); ``chosen(op, a, b, ...)`` what calls of one signature run.

Per-group state (call plans, CUDA contexts, symmetric buffers) is dropped when its group is
destroyed, or on request: ``ficco.ops.release(group)`` before ``destroy_process_group``.

Modules: ``choice`` (the decision, a pure function), ``agree`` (the ranks' agreement on a
call), ``runner`` (one call), ``library`` (custom ops, fakes, autograd), ``observe``
(counters, profiler records), ``groups`` (per-group caches), ``cuda`` (the CUDA path), ``api``.
"""

from ficco.ops.api import (
    all_gather_linear,
    all_gather_matmul,
    all_reduce_add_rms_norm,
    chosen,
    linear_all_reduce,
    linear_reduce_scatter,
    matmul_all_reduce,
    matmul_reduce_scatter,
)
from ficco.ops.choice import CHECK_ENV, Choice, FallbackWarning, Target, choose
from ficco.ops.groups import release
from ficco.ops.observe import ScheduleCount, reset_counts, schedule_counts
from ficco.ops.runner import even_rows

__all__ = [
    "CHECK_ENV",
    "Choice",
    "FallbackWarning",
    "ScheduleCount",
    "Target",
    "all_gather_linear",
    "all_gather_matmul",
    "all_reduce_add_rms_norm",
    "choose",
    "chosen",
    "even_rows",
    "linear_all_reduce",
    "linear_reduce_scatter",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
    "release",
    "reset_counts",
    "schedule_counts",
]
