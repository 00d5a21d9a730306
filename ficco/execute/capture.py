"""Which verified candidates the measuring flow keeps out of CUDA graphs, and why.

``ficco.space.runs_as_graph`` says what a transport's schedules may capture; this module
refuses what is known not to survive capture, by a rule that gives the same answer on every
rank (the ranks must agree before a graph holding NCCL calls is captured or replayed). A
refused candidate is verified and timed as issued eagerly, its ``extra['graph']`` note naming
the reason.

The rule: nothing of an all-to-all pattern (gemm_a2a, a2a_gemm, emb_a2a) that calls NCCL is
captured: neither its NCCL schedules nor the serial baseline's and ``comm_alone``'s captured
twins (the serial plan's ``all_to_all_single``). Why: torch issues ``all_to_all_single`` with
split sizes as one NCCL group of ``ncclSend``/``ncclRecv`` per peer, the point-to-point calls
that the ``nccl`` transport already keeps out of graphs for its overlapped batches
(``batch_isend_irecv``). Captured, on 2xH200 (torch 2.11, NCCL 2.28.9): gemm_a2a with skewed
routing hung (one rank's replay of the captured serial baseline never finished while its
peer's did, after eager all-to-alls on the same communicator; ``NCCL_GRAPH_MIXING_SUPPORT=0``
hung too), and emb_a2a's ``serial/nccl/triton`` replay left rows of its output unwritten
(NaN) after eager all-to-alls of the previous schedule, then its timing hung. With NCCL left
eager (``--graphs ce``) every schedule and baseline of both verified and timed. NCCL's
all-gather, reduce-scatter and all-reduce (ring and tree kernels, no point-to-point) replayed
correctly and stay captured. ``FICCO_CAPTURE_NCCL_ALL_TO_ALL=1`` in the ranks' environment
captures them anyway (to retry on another torch or NCCL; the bisection that found the hangs is
``scripts/timing_hang_bisect.py`` in the tree at 97d577c).
"""

from __future__ import annotations

from ficco.patterns.spec import BASELINE_COMM, BASELINE_SERIAL_EAGER
from ficco.problem import Problem
from ficco.space import Schedule
from ficco.space import transports as _transports

#: the baselines whose captured twins run the serial plan's collective
SERIAL_PLAN_COLLECTIVE_BASELINES = (BASELINE_SERIAL_EAGER, BASELINE_COMM)


def graph_refusal(problem: Problem, schedule: Schedule) -> str | None:
    """Why ``schedule``'s plan is issued eagerly although its transport captures (the note
    its measurement keeps), or None: ``ficco.space.transports.graph_refusal``, the rule the
    cost model's ``runs_as_graph`` applies too. The same on every rank."""
    return _transports.graph_refusal(problem.pattern, schedule)


def baseline_graph_refusal(problem: Problem, name: str) -> str | None:
    """Why baseline ``name`` gets no captured twin (``serial_eager``: no ``serial_graph``),
    or None: where it runs the serial NCCL plan's collective that :func:`graph_refusal`
    keeps eager."""
    if name not in SERIAL_PLAN_COLLECTIVE_BASELINES:
        return None
    return graph_refusal(problem, Schedule())
