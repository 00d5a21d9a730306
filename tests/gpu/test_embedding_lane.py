"""emb_a2a schedules on GPUs (the ``lane`` fixture: one GPU per rank, and ranks that share a
GPU), verified against the reference, nothing timed: the problems and the schedule list are
``tests/emb_lane.py``'s (ficco's space, not a hand list): every transport (``ce``, ``seg``,
``nccl``), table groups (``-m``) and batch chunks (``-b``), ``+merged``, ``+hi`` and SM
reserves, pooling by torch's EmbeddingBag (``cublas``) and by ficco's Triton kernel
(``triton``), sum with a bag size per table and mean with uniform bags, a batch no W divides
and skewed tables. Where ranks share a GPU, ``+fused`` (pool-and-store into peers, waiting
on their flags inside a kernel) and ``nccl_ce`` (NCCL) come back ``unavailable`` with the
reason ("needs distinct GPUs").

Tiers: by default one schedule per (plan, pooling kernel) (153 of the space's 470 per problem
at W = 2, 108 run and 45 refused; 298 of 932 at W = 3, 210 run and 88 refused), which fits
the one-GPU lane's share of its stage; ``FICCO_LANE_EMB=all`` runs every schedule of the
space. On one H100 (torch 2.11, Triton 3.6) a run schedule verifies in about 19 ms at W = 2
and 23 ms at W = 3 and a refused one in next to nothing, after each W's ranks start and
compile (about 9 s): the default tier takes about 40 s with the bench_embedding test, every
schedule about 75 s, more than the lane's share::

    FICCO_LANE_EMB=all FICCO_SHARED_WORLDS="2 3" python3 -m pytest -o addopts= \\
        tests/gpu/test_embedding_lane.py

Each run writes its verdicts to ``$STAGE_DIR/emb_lane_<case>_<lane>.json`` where
``STAGE_DIR`` is set (``scripts/one_gpu_checks.sh``).

The lane catches what hung on two GPUs: its signals keep symmetric memory's handshake (a
second signal on a channel waits until the first is consumed), and a run whose handshakes
hang fails naming the channel (``ficco.execute.cuda_ipc``). The last two tests show both on
the GPU, in one process (the CPU model: tests/test_cuda_ipc.py)."""

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(1)]

from emb_lane import EVERY, lane_problems, lane_schedules, verdict_faults  # noqa: E402

from ficco.execute.run import measure_in  # noqa: E402

CASES = ("sum-per_table", "mean-uniform")
#: seconds without a verdict before a run counts as hung (a schedule verifies in well under
#: a second; its first Triton compiles take a few): a hang costs this, not the pool's 120 s,
#: of the stage's time cap, which the lane's other tests share
SILENCE_S = 30.0
#: the first run of this module whose ranks hung or died: later runs fail at once, not again
BROKEN: list[str] = []


@contextlib.contextmanager
def silence_limit(pool, seconds: float):
    """The pool's no-progress limit set to ``seconds`` while open."""
    before, pool.timeout_s = pool.timeout_s, seconds
    try:
        yield
    finally:
        pool.timeout_s = before


def record(name: str, lane, problem, measured, seconds: float) -> None:
    """The run's verdicts, beside the stage's log (nothing where STAGE_DIR is unset)."""
    folder = os.environ.get("STAGE_DIR")
    if not folder:
        return
    rows = [{"name": m.name, "verdict": m.verdict, "detail": m.detail} for m in measured]
    Path(folder, f"emb_lane_{name}_{lane.backend}-w{lane.world}.json").write_text(
        json.dumps(
            {"problem": problem.key, "every": EVERY, "seconds": seconds, "verdicts": rows},
            indent=1,
        )
    )


@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
def test_every_emb_a2a_schedule_verifies_in_the_lane(case, lane):
    problem = lane_problems(lane.world)[case]
    schedules = lane_schedules(problem)
    if BROKEN:
        pytest.fail(f"not run: an earlier run of this module hung or lost a rank ({BROKEN[0]})")
    started = time.perf_counter()
    with silence_limit(lane.pool, SILENCE_S):
        measured = measure_in(lane.pool, problem, schedules, None, baselines=False)
    if not isinstance(measured, list):  # a PoolFailure: the ranks hung or died
        BROKEN.append(f"{problem.key} on {lane.backend} W = {lane.world}: {measured}")
        pytest.fail(BROKEN[-1])
    record(CASES[case], lane, problem, measured, time.perf_counter() - started)
    faults = verdict_faults(lane.backend, problem, schedules, measured)
    assert not faults, f"{len(faults)} of {len(schedules)}: {faults}"
    if lane.shared:  # the refusals are there, and say why
        refused = [m for m in measured if m.verdict == "unavailable"]
        assert any("+fused" in m.name for m in refused)
        assert all("needs distinct GPUs" in m.detail for m in refused)


def test_bench_embedding_verifies_with_ranks_sharing_the_gpu(tmp_path):
    """``scripts/bench_embedding.py --backend cuda_shared --verify-only`` (its own ranks, W
    = 2, on one GPU) on a tiny DLRM-DCNv2 workload: every schedule of its quick list ok, the
    fused ones unavailable saying why."""
    import importlib.util

    from emb_lane import report_faults

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_embedding.py"
    spec = importlib.util.spec_from_file_location("bench_embedding", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = Path(os.environ.get("STAGE_DIR") or tmp_path, "bench_embedding_cuda_shared.json")
    argv = ["--world", "2", "--quick", "--backend", "cuda_shared", "--verify-only",
            "--batch", "16", "--row-cap", "1000", "--stall-timeout", str(SILENCE_S),
            "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    (row,) = report["problems"]
    assert row["counts"] == {"ok": 4, "unavailable": 2}, row["counts"]
    assert not report_faults("cuda_shared", report)


# --- the signal handshake of ranks that share a GPU (ficco.execute.cuda_ipc) ---------------


def two_handles():
    """Two ranks' handles over the same pads, each rank's ops on its own stream (stream
    memory waits and writes, as the cuda_shared backend issues them), in this process."""
    from ficco.execute.cuda_ipc import SIGNAL_CHANNELS, IpcHandle

    pads = [torch.zeros(SIGNAL_CHANNELS * 2, dtype=torch.int32, device="cuda") for _ in range(2)]
    buffers = [torch.zeros(4, device="cuda") for _ in range(2)]
    handles = [IpcHandle(r, 2, buffers, pads) for r in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    return handles, streams


def test_signals_and_waits_meet_in_order():
    from ficco.execute.cuda_ipc import settle

    (h0, h1), (s0, s1) = two_handles()
    with torch.cuda.stream(s1):  # the waits are queued first: they stall until signalled
        h1.wait_signal(0, channel=5)
        h1.wait_signal(0, channel=5)
    with torch.cuda.stream(s0):
        h0.put_signal(1, channel=5)
        h0.put_signal(1, channel=5)  # waits for the first's consumption
    settle([("y", h0), ("y@1", h1)], 10.0, 0, streams=(s0, s1))
    assert int(h1.flag_of("wait", 0, 5).item()) == 4  # two landed, two consumed


def test_a_second_signal_before_the_first_is_consumed_fails_naming_the_channel():
    """emb_a2a's seg hang on two GPUs: each rank signals twice on a channel before it waits.
    The streams stall; ``settle`` releases them and raises, naming the channel."""
    from ficco.execute.cuda_ipc import SignalTimeout, settle

    (h0, h1), (s0, s1) = two_handles()
    host = torch.empty(8, dtype=torch.int32, pin_memory=True)  # before anything stalls
    for rank, (h, s) in enumerate(((h0, s0), (h1, s1))):
        with torch.cuda.stream(s):
            h.put_signal(1 - rank, channel=3)
            h.put_signal(1 - rank, channel=3)
            h.wait_signal(1 - rank, channel=3)
    with pytest.raises(SignalTimeout) as err:
        settle([("y", h0), ("y@1", h1)], 0.5, 0, streams=(s0, s1), host=host)
    text = str(err.value)
    assert "within 0.5 s" in text
    assert "y: signals to rank 1 on channel 3: 2 put, 1 landed, 0 consumed" in text
    assert "y@1: signals to rank 0 on channel 3: 2 put, 1 landed, 0 consumed" in text
    assert "stay stalled" not in text  # released: the streams drained
    assert s0.query() and s1.query()
