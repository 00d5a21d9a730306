"""The Python API refuses exactly what the CLI refuses, holds the sweep's policies, never
overwrites shipped files without force, and shows itself in help(ficco)."""

import pydoc
from dataclasses import replace
from pathlib import Path

import pytest

import ficco
from ficco import api
from ficco.measure.record import Measurement
from ficco.problem import Problem
from ficco.profile import MemoryStore
from ficco.space import Schedule
from ficco.sweep import ReplayRunner, check_timing_mode, issue_of
from ficco.validate import InputError

REPO = Path(__file__).resolve().parents[1]
RS = Problem(pattern="gemm_rs", m=96, n=80, k=72, world=2, dtype="fp32")
PUBLIC = [
    "Problem",
    "Pattern",
    "Schedule",
    "SpaceOptions",
    "InputError",
    "recommend",
    "run",
    "schedules",
    "parse_schedules",
    "workloads",
    "sweep",
    "SweepRequest",
    "report",
    "train",
    "evaluate",
    "export",
]


def test_help_of_the_package_lists_the_public_api():
    text = pydoc.render_doc(ficco)
    for name in PUBLIC:
        assert name in ficco.__all__ and name in dir(ficco), name
        assert f"``{name}``" in ficco.__doc__, name  # one line each in the docstring
        assert name in text, name
    assert callable(ficco.run) and ficco.recommend is api.recommend


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(rounds=0, backend="cuda"), "rounds"),
        (dict(rounds=True, backend="cuda"), "rounds"),
        (dict(rounds="12.9", backend="cuda"), "rounds"),
        (dict(timeout_s=0), "timeout_s"),
        (dict(timeout_s=float("nan")), "timeout_s"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(backend="tpu"), "backend"),
        (dict(issue=("eager",), backend="cuda"), "issue"),
        (dict(graphs="some", backend="cuda"), "graphs"),
    ],
)
def test_run_refuses_bad_options_before_any_work(kwargs, field):
    with pytest.raises(InputError) as err:
        api.run(RS, ["shard/ce/cublas"], **kwargs)
    assert err.value.field == field and str(err.value).startswith(f"{field}:")


def test_run_options_accept_integers_and_their_strings_and_fill_defaults():
    from ficco.backends import backend_spec

    request = api.RunRequest.of(RS, ["shard/ce/cublas"], backend="cuda", rounds="7", seed="3",
                                timeout_s="2.5")  # fmt: skip
    options = request.options
    assert (options.timing.rounds, options.seed, options.timeout_s) == (7, 3, 2.5)
    assert not options.timing.signatures  # a run shows times; a sweep measures signatures
    assert request.schedules == (Schedule.parse("shard/ce/cublas"),)
    cuda = backend_spec("cuda")
    assert request.spec is cuda and request.backend == "cuda"
    default = api.RunRequest.of(RS, backend="cuda").options
    assert default.timing == replace(cuda.timing, signatures=False)
    assert default.timeout_s == cuda.timeout_s
    assert api.RunRequest.of(RS, backend="cpu").options.timing is None  # cpu verifies only
    assert api.RunRequest.of(RS, backend="cpu").schedules == tuple(api.schedules(RS))
    with pytest.raises(InputError, match="rounds: needs at least 1 round"):
        api.RunRequest.of(RS, backend="cpu", rounds=0)  # refused even where nothing is timed


def test_a_run_request_is_checked_whole_and_run_as_it_is():
    from ficco.backends import backend_spec
    from ficco.execute import RunOptions

    # typed: the options whole (a RunOptions), the schedules legal, the seed an integer >= 0
    request = api.RunRequest(problem=RS, schedules=("shard/ce/cublas",), backend="cpu")
    assert request.options == RunOptions(timeout_s=backend_spec("cpu").timeout_s)
    with pytest.raises(InputError, match="options: must be a ficco.execute.RunOptions"):
        api.RunRequest(problem=RS, backend="cpu", options={"seed": 1})
    with pytest.raises(InputError, match="seed: must be an integer >= 0"):
        api.RunRequest(problem=RS, backend="cpu", options=RunOptions(seed=-1))
    with pytest.raises(InputError, match="sm_reserve_leaves_sms"):
        api.RunRequest(problem=RS, schedules=["finer-c2-m/nccl/triton+sm99999"], backend="cpu")
    # given whole to run, with nothing beside it but on_result
    with pytest.raises(InputError, match="seed: a RunRequest holds the schedules and the opt"):
        api.run(request, seed=4)


def test_run_refuses_a_cpu_world_past_the_limit_before_spawning():
    wide = Problem(pattern="ag_gemm", m=1000, n=8, k=8, world=1000, dtype="fp32")
    with pytest.raises(InputError, match=r"world: .*at most 16.*got 1000"):
        api.run(wide, backend="cpu")


def test_run_refuses_illegal_and_unparsable_schedules():
    with pytest.raises(InputError, match="sm_reserve_leaves_sms"):
        api.run(RS, ["finer-c2-m/nccl/triton+sm99999"])
    with pytest.raises(InputError, match="schedule: transport: unknown value 'ib'"):
        api.run(RS, ["shard/ib/cublas"])
    with pytest.raises(InputError, match="schedule: give at least one schedule"):
        api.run(RS, [])


def test_make_problem_reads_routing_json_and_refuses_fractions():
    p = api.make_problem("a2a_gemm", m=25, n=8, k=8, world=2, experts=2, routing="[[12,1],[6,6]]")
    assert p.routing == ((12, 1), (6, 6)) and p.dtype == "bf16"
    assert api.make_problem("ag_gemm", m="64", n=8, k=8, world=2, backend="cpu").dtype == "fp32"
    with pytest.raises(InputError, match=r"routing: must be an integer .*got 12.9"):
        api.make_problem(
            "a2a_gemm", m=25, n=8, k=8, world=2, experts=2, routing="[[12.9,0.1],[6,6]]"
        )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(timeout_s=0), "timeout_s"),
        (dict(world=1000), "world"),
        (dict(timing=dict(rounds=3)), "timing"),
        (dict(trials=0), "trials"),
        (dict(trials=2.5), "trials"),
        (dict(trial_fraction=0), "trial_fraction"),
        (dict(batch=True), "batch"),
        (dict(chunks=(2, 1)), "chunks[1]"),
        (dict(limit_schedules="many"), "limit_schedules"),
        (dict(time_limit_s=-1), "time_limit_s"),
        (dict(tokens=(64, 0)), "tokens[1]"),
        (dict(ep=1), "ep"),
        (dict(strategy="grid"), "strategy"),
        (dict(workloads=()), "workloads/shapes"),
        (dict(store=str(REPO / "profiles" / "h200x2" / "store")), "store"),
    ],
)
def test_sweep_request_refuses_what_the_cli_refuses(kwargs, field, tmp_path):
    base = dict(workloads=("llama3-8b",), world=2, backend="cpu", store=str(tmp_path / "s"))
    with pytest.raises(InputError) as err:
        api.SweepRequest.of(**(base | kwargs))
    assert err.value.field == field


def test_sweep_request_defaults_come_from_the_backend_specs(tmp_path):
    from ficco.backends import backend_spec

    cpu = api.SweepRequest.of(workloads=("llama3-8b",), world=2, backend="cpu", store=str(tmp_path))
    cuda = api.SweepRequest.of(workloads=("llama3-8b",), world="2", store=str(tmp_path))
    for request, name in ((cpu, "cpu"), (cuda, "cuda")):
        spec = backend_spec(name)
        assert request.spec is spec
        assert (request.options.timing, request.options.timeout_s) == (spec.timing, spec.timeout_s)
    assert (cpu.options.timing.rounds, cuda.options.timing.rounds, cuda.world) == (3, 10, 2)
    assert cuda.options.timing.signatures and not cpu.options.timing.signatures
    timing = api.timing_options("cuda", rounds="auto", issue="synced", signatures=False)
    assert (timing.rounds, timing.issue, timing.signatures, timing.warmup) == (
        "auto",
        ("synced",),
        False,
        backend_spec("cuda").timing.warmup,
    )
    shipped = str(REPO / "profiles" / "h200x2" / "store")
    assert api.SweepRequest.of(workloads=("llama3-8b",), world=2, store=shipped, force=True)


def test_a_sweep_request_holds_its_space_and_options_whole_and_hands_them_down(
    tmp_path, monkeypatch
):
    """The loose values become three typed parts once (the space, the ranks' options, the
    strategy's options); a typed request holding them is the same request, and the sweep
    hands them to the runner and the strategy as they are."""
    import ficco.sweep
    from ficco.execute import RunOptions
    from ficco.space import Gemm, SpaceOptions
    from ficco.sweep import SweepOptions

    where = dict(workloads=("llama3-8b",), world=2, tokens=(64,), backend="cpu")
    where["store"] = str(tmp_path / "s")
    loose = api.SweepRequest.of(
        **where, gemms=("cublas",), chunks=("2",), seed="7", strategy="optuna", trials="3",
        limit_schedules=5,
    )  # fmt: skip
    assert loose.space == SpaceOptions(gemms=(Gemm.CUBLAS,), chunk_counts=(2,))
    assert loose.options.seed == loose.sweep.seed == 7  # the inputs' seed and the sampler's
    assert (loose.sweep.trials, loose.sweep.limit_schedules) == (3, 5)
    parts = dict(space=loose.space, options=loose.options, sweep=loose.sweep)
    assert api.SweepRequest(**where, strategy="optuna", **parts) == loose
    with pytest.raises(InputError, match="trials: applies to --strategy optuna only"):
        api.SweepRequest(**where, sweep=SweepOptions(trials=3))
    with pytest.raises(InputError, match="space: must be a ficco.space.SpaceOptions"):
        api.SweepRequest(**where, space={"gemms": ("cublas",)})
    typed = api.SweepRequest(**where, options=RunOptions(seed=2))  # its timing: the backend's
    assert typed.options.timing == typed.spec.timing and typed.options.seed == 2

    class Handed(Exception):
        pass

    def make_runner(spec, options):
        raise Handed(spec, options)

    monkeypatch.setattr(ficco.sweep, "make_runner", make_runner)
    with pytest.raises(Handed) as handed:
        api.sweep(loose, notify=lambda line: None)
    assert handed.value.args[0] is loose.spec and handed.value.args[1] is loose.options


class _TimedRunner(ReplayRunner):
    """A replayed runner that says it times under one issue mode, as the GPU runner does."""

    def __init__(self, source, issue: str) -> None:
        super().__init__(source)
        self._issue = issue

    @property
    def issue_mode(self) -> str:
        return self._issue


def test_the_sweep_api_refuses_a_store_timed_the_other_way(tmp_path):
    """The guard is the sweep's, not the CLI's: a Python caller gets it too."""
    from synthetic import write_synthetic_store

    from ficco.space import SpaceOptions
    from ficco.sweep import sweep

    source = tmp_path / "source"
    problem = Problem(pattern="ag_gemm", m=4096, n=1280, k=8192, world=2, name="toy.qkv")
    write_synthetic_store(source, [problem], SpaceOptions(chunk_counts=(2,), sm_reserves=(0,)))
    store = MemoryStore({"backend": "synthetic"})
    timed = Measurement(
        problem=problem.to_dict(),
        name="shard/ce/cublas",
        kind="schedule",
        median_ms=1.0,
        extra={"issue": {"synced": {}}},
    )
    store.append(timed)
    assert issue_of(store.records()[0]) == "synced"
    runner = _TimedRunner(source, "queued")
    with pytest.raises(ValueError, match="timed with issue mode synced .* asks queued"):
        check_timing_mode(store, runner)
    with pytest.raises(ValueError, match="timed with issue mode synced"):
        sweep([problem], runner=runner, store=store)
    check_timing_mode(store, _TimedRunner(source, "synced"))  # the same mode is accepted


def test_shipped_files_are_refused_without_force(tmp_path, monkeypatch):
    monkeypatch.setenv("FICCO_HOME", str(tmp_path / "home"))
    shipped_table = REPO / "schedules" / "h200x2" / "table.json"
    before = shipped_table.read_bytes()
    with pytest.raises(InputError, match=r"table\.json is a file shipped with ficco.*--force"):
        api.train("profiles/h200x2/store", REPO / "schedules" / "h200x2")
    with pytest.raises(InputError, match=r"out: .*shipped.*--force"):
        api.export("h200x2", format="json", out=REPO / "schedules" / "h200x2" / "table.json")
    with pytest.raises(InputError, match=r"out: .*shipped.*--force"):
        api.report(REPO / "profiles" / "h200x2" / "store", REPO / "profiles" / "h200x2" / "r")
    assert shipped_table.read_bytes() == before
    done = api.export("h200x2", format="header")
    assert done.path == tmp_path / "home" / "exports" / "ficco_h200x2.h" and done.path.is_file()


def test_unwritable_output_is_refused_before_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match=r"out: cannot be created: .*file is a file"):
        api.export("h200x2", format="json", out=blocker / "t.json")
    with pytest.raises(InputError, match="out: is a directory"):
        api.export("h200x2", format="json", out=tmp_path)
