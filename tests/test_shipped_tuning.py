"""The measured GEMM tuning caches shipped in the package (``schedules/<card>/``): a lookup
takes their entry where the user's cache has none, the user's entry first, and only entries
measured on this device with this Triton. No kernel runs here: tuning is a stand-in that
refuses, so a test fails if a lookup would have tuned."""

import os

import torch

if not torch.cuda.is_available():
    # Triton reads this when kernels are decorated: before ficco.kernels is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402
import warnings  # noqa: E402
from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from ficco.kernels import fused_configs, tuning  # noqa: E402
from ficco.kernels.configs import GemmConfig, heuristic_config  # noqa: E402
from ficco.kernels.fused_configs import FusedTuningKey  # noqa: E402
from ficco.shipped import shipped_dir  # noqa: E402

CPU = torch.device("cpu")
SHAPE = (40, 48, 64)  # m, n, k
BUDGET = 3
# tiles no heuristic picks for SHAPE (they are only looked up here, never launched)
SHIPPED = GemmConfig(128, 128, 64, group_m=8, num_stages=3, num_warps=8)
OWN = GemmConfig(64, 128, 64, group_m=8, num_stages=4, num_warps=4)
SMALL = GemmConfig(64, 64, 64, group_m=8, num_stages=3, num_warps=4)


@pytest.fixture
def shipped_root(tmp_path, monkeypatch):
    """An empty user cache and a shipped folder of our own; tuning refuses."""
    monkeypatch.setenv("FICCO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FICCO_GEMM_AUTOTUNE", "1")
    root = tmp_path / "schedules"
    monkeypatch.setattr(tuning, "SHIPPED_TUNING", root)

    def no_tuning(*args, **kwargs):
        raise AssertionError("tuned")

    monkeypatch.setattr(tuning, "tune", no_tuning)
    tuning.clear_memory()
    yield root
    tuning.clear_memory()


def _ship(root, card: str, entries: dict, filename: str = "gemm_tuning.json") -> None:
    folder = root / card
    folder.mkdir(parents=True, exist_ok=True)
    body = {str(key): {"config": cfg.to_dict(), "name": cfg.name} for key, cfg in entries.items()}
    (folder / filename).write_text(json.dumps({"format": 1, "entries": body}))


def _key(m: int = SHAPE[0], n: int = SHAPE[1], k: int = SHAPE[2]) -> tuning.TuningKey:
    return tuning.TuningKey.for_problem(m, n, k, torch.float32, BUDGET, CPU)


def _config_for(m: int = SHAPE[0], n: int = SHAPE[1], k: int = SHAPE[2]):
    return tuning.config_for(m, n, k, torch.float32, BUDGET, CPU)


def test_a_shipped_entry_answers_where_the_users_cache_has_none(shipped_root, monkeypatch):
    shipped = SHIPPED
    assert shipped != heuristic_config(*SHAPE, interpreter=True)
    _ship(shipped_root, "card", {_key(): shipped})
    assert _config_for() == shipped
    assert not tuning.cache_path().exists()  # read, not copied into the user's cache
    # without autotuning too (the shipped entry comes before the heuristic)
    tuning.clear_memory()
    monkeypatch.setenv("FICCO_GEMM_AUTOTUNE", "0")
    assert _config_for() == shipped
    # a shape no file holds is tuned (here: refused by the stand-in)
    monkeypatch.setenv("FICCO_GEMM_AUTOTUNE", "1")
    with pytest.raises(AssertionError, match="tuned"):
        _config_for(k=128)


def test_the_users_cache_wins_over_a_shipped_entry(shipped_root):
    shipped, own = SHIPPED, OWN
    _ship(shipped_root, "card", {_key(): shipped})
    tuning.store(_key(), {"config": own.to_dict(), "name": own.name})
    tuning.clear_memory()
    assert _config_for() == own


def test_a_shipped_entry_of_another_device_or_triton_is_not_used(shipped_root, monkeypatch):
    shipped = SHIPPED
    other_device = replace(_key(), device_name="NVIDIA H200")
    other_triton = replace(_key(), triton_version="0.0.1")
    assert str(other_device) != str(_key()) != str(other_triton)
    _ship(shipped_root, "h200", {other_device: shipped})
    _ship(shipped_root, "card", {other_triton: shipped})
    assert len(tuning.shipped_entries("gemm_tuning.json")) == 2  # both files were read
    with pytest.raises(AssertionError, match="tuned"):
        _config_for()
    monkeypatch.setenv("FICCO_GEMM_AUTOTUNE", "0")
    assert _config_for() == heuristic_config(*SHAPE, interpreter=True)


def test_a_shipped_fused_entry_answers_the_fused_lookup(shipped_root, monkeypatch):
    shipped = SHIPPED
    key = FusedTuningKey.for_problem(*SHAPE, 2, torch.float32, BUDGET, CPU)
    _ship(shipped_root, "card", {key: shipped})
    # the TMA path's tile on a GPU: no untuned tile, so the tuned (here: shipped) one
    monkeypatch.setattr(fused_configs, "untuned_fused_config", lambda *args: None)

    def no_persistent(*args):
        raise AssertionError("fell back to the persistent GEMM's config")

    monkeypatch.setattr(fused_configs, "config_for", no_persistent)
    assert fused_configs.fused_config(*SHAPE, 2, torch.float32, BUDGET, CPU, "tma") == shipped
    with pytest.raises(AssertionError, match="persistent"):  # three chunks: no entry
        fused_configs.fused_config(*SHAPE, 3, torch.float32, BUDGET, CPU, "tma")


def test_a_launch_whose_chunks_arrive_takes_the_arriving_entry_first(shipped_root, monkeypatch):
    ready_key = FusedTuningKey.for_problem(*SHAPE, 2, torch.float32, BUDGET, CPU)
    late_key = FusedTuningKey.for_problem(*SHAPE, 2, torch.float32, BUDGET, CPU, arriving=True)
    assert str(late_key) == f"{ready_key}|arriving"
    _ship(shipped_root, "card", {ready_key: SHIPPED, late_key: OWN})
    monkeypatch.setattr(fused_configs, "untuned_fused_config", lambda *args: None)
    lookup = (*SHAPE, 2, torch.float32, BUDGET, CPU, "tma")
    assert fused_configs.fused_config(*lookup) == SHIPPED  # every flag ready: the fastest
    assert fused_configs.fused_config(*lookup, arriving=True) == OWN
    # the user's own flags-set entry (a shape the user tuned) before the shipped twin
    tuning.store(ready_key, {"config": SMALL.to_dict(), "name": SMALL.name})
    assert fused_configs.fused_config(*lookup, arriving=True) == SMALL
    tuning.store(late_key, {"config": OWN.to_dict(), "name": OWN.name})
    assert fused_configs.fused_config(*lookup, arriving=True) == OWN  # the user's own twin
    assert fused_configs.fused_config(*lookup) == SMALL
    # no arriving entry anywhere: the flags-set one
    (shipped_root.parent / "cache" / "gemm_tuning.json").unlink()
    tuning.clear_memory()
    _ship(shipped_root, "card", {ready_key: SHIPPED})
    assert fused_configs.fused_config(*lookup, arriving=True) == SHIPPED


def test_every_shipped_fused_entry_has_its_arriving_twin_from_its_own_timings():
    from ficco.kernels.configs import fused_candidate_configs
    from ficco.kernels.fused_tuning import arrival_entry

    for card in ("h100", "h200"):
        entries = json.loads((shipped_dir("schedules") / card / "gemm_tuning.json").read_text())[
            "entries"
        ]
        fused = [key for key in entries if key.endswith("|fused|chunks=2")]
        assert len(fused) == 67, card
        # recomputed from the entry: the shipped twin is that pick (the few-row shapes,
        # where the twin differs most, and five others; all 67 take a minute)
        few_rows = [key for key in fused if int(key.split("|")[3].split(",")[0][2:]) <= 512]
        for key in dict.fromkeys(few_rows + fused[:5]):
            entry, twin = entries[key], entries[f"{key}|arriving"]
            m, n, k = (int(part.split("=")[1]) for part in key.split("|")[3].split(","))
            configs = {
                c.name: c
                for c in fused_candidate_configs(-(-m // 2), n, k, 2, 2, chunks=2, sm_budget=132)
            }
            configs[entry["name"]] = GemmConfig.from_dict(entry["config"])
            again = arrival_entry(entry, configs, m, n, k, 2, 132)
            assert (twin["name"], twin["config"]) == (again["name"], again["config"]), key
        picked = {entries[f"{key}|arriving"]["name"] for key in fused}
        assert picked - {entries[key]["name"] for key in fused}, (
            card
        )  # the model chose anew somewhere


def test_a_shipped_file_is_read_once_per_process(shipped_root):
    _ship(shipped_root, "card", {_key(): SHIPPED})
    first = tuning.shipped_entries("gemm_tuning.json")
    (shipped_root / "card" / "gemm_tuning.json").unlink()
    assert tuning.shipped_entries("gemm_tuning.json") is first
    tuning.clear_memory()  # the next lookup re-reads
    assert tuning.shipped_entries("gemm_tuning.json") == {}


@pytest.mark.parametrize(
    ("card", "device"), [("h100", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200")]
)
@pytest.mark.parametrize("filename", ["gemm_tuning.json", "fp8_gemm_tuning.json"])
def test_the_package_ships_each_cards_tuning_caches(card, device, filename):
    path = shipped_dir("schedules") / card / filename
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every entry parses as a config
        entries = tuning._read_entries(path)
        configs = {k: tuning._config_of(k, e, path) for k, e in entries.items()}
    assert entries, f"{path} holds no entries"
    # a card's file holds that card's entries only (keys say which device they apply to)
    assert {key.split("|")[0] for key in configs} == {device}
    assert set(configs) <= set(tuning.shipped_entries(filename))


def test_a_shipped_cache_passes_over_a_config_that_left_the_space(capsys):
    # scripts/tuning_cache_from_benches.py: a run's fastest config that today's space refuses
    # (a 192-column tile, removed since) gives way to the next fastest the space still has
    import importlib.util
    from pathlib import Path

    from ficco.kernels.configs import candidate_configs

    script = Path(__file__).resolve().parents[1] / "scripts" / "tuning_cache_from_benches.py"
    spec = importlib.util.spec_from_file_location("tuning_cache_from_benches", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    m, n, k, sm = 1024, 3072, 4096, 132
    kept = candidate_configs(m, n, k, 2, 2, sm_budget=sm)[0]
    gone = {**kept.to_dict(), "block_n": 192}
    entry = {"name": "128x192x64_gone", "config": gone}
    options = {"128x192x64_gone": 0.040, kept.name: 0.045}
    name, cfg = module._pick(options, m, n, k, sm, entry)
    assert (name, cfg) == (kept.name, kept)
    assert "128x192x64_gone passed over" in capsys.readouterr().err
    with pytest.raises(ValueError, match="none of"):
        module._pick({"128x192x64_gone": 0.040}, m, n, k, sm, entry)
