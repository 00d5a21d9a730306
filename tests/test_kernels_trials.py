"""The check-then-time loop both GEMM tuners share (`ficco.kernels.trials`), and the rotated
interleaving the single-kernel benchmarks time with (`ficco.execute.timing`)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from ficco.execute.options import TimingOptions  # noqa: E402
from ficco.execute.timing import time_rounds, warm_then_rounds  # noqa: E402
from ficco.kernels.configs import INTERPRETER_CONFIGS, GemmConfig  # noqa: E402
from ficco.kernels.trials import (  # noqa: E402
    MAX_ROUNDS,
    MIN_ROUNDS,
    ROUNDS_GPU_MS,
    Rejected,
    Trials,
    check_then_time,
    relative_error,
    rounds_for,
    tuning_record,
)

GOOD, WRONG, PARTIAL, REJECTED, BROKEN = (
    GemmConfig(16, 16, 16, 4, 1, 4),
    GemmConfig(32, 32, 32, 4, 1, 4),
    GemmConfig(16, 32, 16, 4, 1, 4),
    GemmConfig(32, 16, 16, 4, 1, 4),
    GemmConfig(64, 64, 64, 4, 1, 4),
)


def test_only_correct_candidates_are_timed():
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(8, 6, generator=gen), torch.randn(6, 5, generator=gen)
    ref = a @ b
    out = torch.empty(8, 5)

    def build(cfg):
        if cfg == REJECTED:
            raise Rejected("ran as something smaller")
        if cfg == BROKEN:
            raise RuntimeError("does not compile")

        def run():
            if cfg == GOOD:
                torch.matmul(a, b, out=out)
            elif cfg == WRONG:
                torch.matmul(a, b, out=out).mul_(1.5)
            else:  # PARTIAL: one row never written
                out[1:] = (a @ b)[1:]

        return run

    timed = []

    def timer(fn):
        timed.append(fn)
        return 2.5

    trials = check_then_time(
        [GOOD, WRONG, PARTIAL, REJECTED, BROKEN], build, out, ref, timer, lambda: None
    )
    assert trials.timings_ms == {GOOD.name: 2.5} and len(timed) == 1
    assert trials.failures[WRONG.name].startswith("incorrect: relative error 0.5")
    assert trials.failures[PARTIAL.name] == "incorrect: relative error nan"
    assert trials.failures[REJECTED.name] == "ran as something smaller"
    assert trials.failures[BROKEN.name] == "compile: RuntimeError: does not compile"
    assert trials.best() == GOOD.name
    entry = tuning_record(trials, 8, 5, 6, "tma", 0.0)
    assert entry["config"] == GOOD.to_dict() and entry["ms"] == 2.5
    assert entry["failures"] == trials.failures


class _RoundsTimer:
    """A RoundsTimer that records how it was asked: GOOD takes 0.5 ms, the others 0.01."""

    def __init__(self):
        self.asked = []

    def medians(self, fns, rounds):
        self.asked.append((sorted(fns), rounds))
        for fn in fns.values():
            fn()
        return {name: (0.5 if name == GOOD.name else 0.01) for name in fns}


def test_rounds_timer_times_the_correct_candidates_together():
    gen = torch.Generator().manual_seed(8)
    a, b = torch.randn(8, 6, generator=gen), torch.randn(6, 5, generator=gen)
    ref = a @ b
    out = torch.empty(8, 5)
    fast = GemmConfig(16, 16, 32, 4, 1, 4)  # correct too, and faster

    def build(cfg):
        def run():
            torch.matmul(a, b, out=out)
            if cfg == WRONG:
                out.mul_(1.5)

        return run

    timer = _RoundsTimer()
    trials = check_then_time([GOOD, WRONG, fast], build, out, ref, timer, lambda: None)
    # checked one by one; the two correct ones timed together: an estimate, then the rounds
    # (0.51 ms a round: ROUNDS_GPU_MS / 0.51 rounds, within the bounds)
    assert timer.asked == [
        (sorted([GOOD.name, fast.name]), 1),
        (sorted([GOOD.name, fast.name]), rounds_for([0.5, 0.01])),
    ]
    assert trials.timings_ms == {GOOD.name: 0.5, fast.name: 0.01}
    assert trials.best() == fast.name and WRONG.name in trials.failures


def test_rounds_for_bounds():
    assert rounds_for([1000.0]) == MIN_ROUNDS
    assert rounds_for([1e-6]) == MAX_ROUNDS
    assert rounds_for([ROUNDS_GPU_MS / 10]) == 10
    assert rounds_for([]) == MAX_ROUNDS


def test_best_is_the_fastest():
    cfgs = {c.name: c for c in INTERPRETER_CONFIGS[:3]}
    names = list(cfgs)
    trials = Trials({names[0]: 3.0, names[1]: 1.0, names[2]: 2.0}, {}, cfgs)
    assert trials.best() == names[1]


def test_relative_error():
    ref = torch.tensor([3.0, 4.0])
    assert relative_error(ref.clone(), ref) == 0.0
    assert relative_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)


class _LogClock:
    def __init__(self):
        self.calls = []

    def prepare(self, issue):
        pass

    def time(self, fn):
        fn()
        return 1.0

    def collect(self, pending):
        return {name: list(got) for name, got in pending.items()}

    def synchronize(self):
        pass


@pytest.mark.parametrize(
    ("rotate", "expected"),
    [(False, "ABCABCABC"), (True, "ABCBCACAB")],
)
def test_rotated_rounds(rotate, expected):
    clock = _LogClock()
    fns = {name: (lambda name=name: clock.calls.append(name)) for name in "ABC"}
    samples = time_rounds(fns, TimingOptions(warmup=0, rounds=3), clock, rotate=rotate)
    assert "".join(clock.calls) == expected
    assert {name: len(s) for name, s in samples.items()} == {"A": 3, "B": 3, "C": 3}


def test_warm_then_rounds_sizes_the_rounds_by_the_reference():
    ran = []
    calls = []

    def interleaved(fns, rounds):
        calls.append(rounds)
        return {name: [2.0 if name == "ref" else 1.0] * rounds for name in fns}

    fns = {"ref": lambda: ran.append("ref"), "other": lambda: ran.append("other")}
    times, rounds = warm_then_rounds(fns, interleaved, lambda ms: int(10 * ms), "ref")
    assert ran == ["ref", "other"]  # each once, before any timed round
    assert calls == [2, 20] and rounds == 20 and len(times["other"]) == 20
    # no reference among the candidates (it failed its check): 1 ms
    _, rounds = warm_then_rounds(
        {"other": fns["other"]}, interleaved, lambda ms: int(10 * ms), "ref"
    )
    assert rounds == 10


def _shuffled_calls(seed: int, rounds: int = 40) -> list[str]:
    clock = _LogClock()
    fns = {name: (lambda name=name: clock.calls.append(name)) for name in "ABCD"}
    samples = time_rounds(fns, TimingOptions(warmup=0, rounds=rounds), clock, shuffle=seed)
    assert {name: len(s) for name, s in samples.items()} == dict.fromkeys("ABCD", rounds)
    return ["".join(clock.calls[i : i + 4]) for i in range(0, len(clock.calls), 4)]


def test_shuffled_rounds_take_each_candidate_once_a_round_in_seeded_orders():
    orders = _shuffled_calls(seed=3)
    assert all(sorted(order) == list("ABCD") for order in orders)
    # the same seed, the same orders (every rank alike); another seed, others
    assert orders == _shuffled_calls(seed=3)
    assert orders != _shuffled_calls(seed=4)
    # no candidate follows the same one round after round (rotated, B follows A in 3 of 4)
    followers_of_a = {order[order.index("A") + 1] for order in orders if order[-1] != "A"}
    assert len(followers_of_a) == 3
