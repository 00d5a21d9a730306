import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ficco.cli import main
from ficco.problem import Pattern
from ficco.workloads import (
    DEFAULT_TOKENS,
    MODELS,
    PHASE_TOKENS,
    SHAPES_COLUMNS,
    ModelConfig,
    ParallelSetup,
    catalog_problems,
    get_model,
    model_problems,
    read_shapes_csv,
    unique_problems,
    write_shapes_csv,
)

NEW_MODELS = (
    "mistral-large-2",
    "nemotron-4-340b",
    "qwen3-235b-a22b",
    "gpt-oss-120b",
    "llama4-maverick",
)


def test_catalog_has_the_required_models_with_sources():
    for name in (
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "llama2-70b",
        "gpt3-175b",
        "mixtral-8x7b",
        "deepseek-v3",
        *NEW_MODELS,
    ):
        assert MODELS[name].source
        assert MODELS[name].layers > 0  # every entry records its dense/MoE layout
    assert len(MODELS) == 12  # exactly these models, no others


def test_dense_layers_match_the_measured_wave1_shapes_at_two_ranks():
    # FACTS.md: l3-8b.qkv N 3072 K 4096, fc1 N 14336, out K 2048, fc2 K 7168 (W=2)
    problems, skipped = model_problems(
        get_model("llama3-8b"), ParallelSetup(world=2, tokens=(4096,))
    )
    assert not skipped
    layers = {p.name: p for p in problems}
    qkv, out = layers["llama3-8b.qkv"], layers["llama3-8b.out"]
    fc1, fc2 = layers["llama3-8b.fc1"], layers["llama3-8b.fc2"]
    assert (qkv.pattern, qkv.n, qkv.k) == (Pattern.AG_GEMM, 3072, 4096)
    assert (fc1.pattern, fc1.n, fc1.k) == (Pattern.AG_GEMM, 14336, 4096)
    assert (out.pattern, out.n, out.k) == (Pattern.GEMM_RS, 4096, 2048)
    assert (fc2.pattern, fc2.n, fc2.k) == (Pattern.GEMM_RS, 4096, 7168)
    assert all(p.m == 4096 and p.world == 2 and p.dtype == "bf16" for p in problems)


def test_tensor_parallel_split_and_replicated_kv_heads():
    problems, _ = model_problems(get_model("llama3-70b"), ParallelSetup(world=16, tokens=(8192,)))
    layers = {p.name: p for p in problems}
    # 64 heads / 16 = 4 query heads; 8 kv heads < 16 ranks: one replicated kv head per rank
    assert layers["llama3-70b.qkv"].n == (4 + 2 * 1) * 128
    assert layers["llama3-70b.out"].k == 64 * 128 // 16
    assert layers["llama3-70b.fc2"].k == 28672 // 16
    gpt, _ = model_problems(get_model("gpt3-175b"), ParallelSetup(world=8, tokens=(2048,)))
    fc1 = next(p for p in gpt if p.name == "gpt3-175b.fc1")
    assert fc1.n == 4 * 12288 // 8  # GeLU: no gate, one projection


def test_moe_layers_are_all_to_all_problems_with_routed_tokens():
    problems, _ = model_problems(
        get_model("mixtral-8x7b"), ParallelSetup(world=4, ep=8, tokens=(1024,))
    )
    layers = {p.name: p for p in problems}
    up, down = layers["mixtral-8x7b.expert_up"], layers["mixtral-8x7b.expert_down"]
    assert (up.pattern, up.m, up.k, up.n) == (Pattern.A2A_GEMM, 1024 * 2, 4096, 2 * 14336)
    assert (down.pattern, down.m, down.k, down.n) == (Pattern.GEMM_A2A, 1024 * 2, 14336, 4096)
    assert up.world == down.world == 8 and up.experts == 8 and up.routing is None
    assert layers["mixtral-8x7b.qkv"].world == 4
    ds, _ = model_problems(get_model("deepseek-v3"), ParallelSetup(world=8, tokens=(4096,)))
    names = {p.name for p in ds}
    assert {"deepseek-v3.shared_fc1", "deepseek-v3.fc1", "deepseek-v3.expert_up"} <= names
    up = next(p for p in ds if p.name == "deepseek-v3.expert_up")
    assert (up.m, up.n, up.experts) == (4096 * 8, 2 * 2048, 256)


def test_combinations_that_do_not_divide_are_skipped_with_reasons():
    problems, skipped = catalog_problems(
        ["mixtral-8x7b", "gpt3-175b"], ParallelSetup(world=64, tokens=(1000, 4096))
    )
    reasons = {(s.name, s.tokens): s.reason for s in skipped}
    assert "experts" in reasons[("mixtral-8x7b.expert_up", 4096)]
    assert "96 attention heads" in reasons[("gpt3-175b.qkv", 4096)]
    assert "divisible by world" in reasons[("gpt3-175b.fc1", 1000)]
    for p in problems:  # whatever is kept is a valid problem with whole per-rank sizes
        assert p.m % p.world == 0 and p.n > 0 and p.k > 0
        assert p.name.split(".")[0] in MODELS


def test_same_shapes_are_measured_once():
    problems, _ = catalog_problems(["llama3-70b", "llama2-70b"], ParallelSetup(world=8))
    unique, aliases = unique_problems(problems)
    assert len(unique) == len(problems) // 2
    assert aliases["llama2-70b.fc1@4096"] == "llama3-70b.fc1@4096"
    assert {p.name.split(".")[0] for p in unique} == {"llama3-70b"}


def test_shapes_csv_round_trip(tmp_path):
    problems, _ = catalog_problems(
        ["llama3-8b", "mixtral-8x7b"], ParallelSetup(world=4, tokens=(2048,))
    )
    path = tmp_path / "shapes.csv"
    write_shapes_csv(problems, path)
    assert path.read_text().splitlines()[0] == ",".join(SHAPES_COLUMNS)
    again = read_shapes_csv(path)
    assert again == problems
    assert [p.name for p in again] == [p.name for p in problems]


def test_shapes_csv_bad_row_names_the_row(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(
        "name,pattern,m,n,k,world,dtype,experts\nx.a,ag_gemm,64,8,8,2,bf16,\n"
        "x.b,ag_gemm,63,8,8,2,bf16,\n"
    )
    with pytest.raises(ValueError, match="bad.csv: line 3: m:"):
        read_shapes_csv(path)


def test_bad_setup_and_model_are_refused():
    with pytest.raises(ValueError, match="world"):
        ParallelSetup(world=1)
    with pytest.raises(ValueError, match="model: unknown model 'llama9'"):
        get_model("llama9")


def test_cli_workloads_json_and_csv(tmp_path):
    csv_path = tmp_path / "s.csv"
    result = CliRunner().invoke(
        main,
        [
            "workloads",
            "--model",
            "llama3-70b",
            "--world",
            "8",
            "-t",
            "4096",
            "--json",
            "--csv",
            str(csv_path),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    names = [p["name"] for p in payload["problems"]]
    assert names == ["llama3-70b.qkv", "llama3-70b.out", "llama3-70b.fc1", "llama3-70b.fc2"]
    assert payload["setup"]["world"] == 8
    assert len(read_shapes_csv(csv_path)) == 4


def test_cli_workloads_table_and_unknown_model():
    runner = CliRunner()
    result = runner.invoke(main, ["workloads", "--model", "mixtral-8x7b", "-w", "16", "-t", "4096"])
    assert result.exit_code == 0, result.output
    assert "mixtral-8x7b.qkv" in result.output and "skipped" in result.output
    assert runner.invoke(main, ["workloads", "--model", "nope"]).exit_code == 2


def test_cli_workloads_takes_several_values_after_one_flag():
    """`--tokens 1024 2048` as the README and `--help` write it, `-t 1024 -t 2048` as before,
    and `--tokens=1024 2048`: the same problems."""
    runner = CliRunner()
    spelled = [
        ["--model", "llama3-8b", "gpt3-175b", "-w", "2", "--tokens", "1024", "2048", "--json"],
        [
            "--model",
            "llama3-8b",
            "--model",
            "gpt3-175b",
            "-w",
            "2",
            "-t",
            "1024",
            "-t",
            "2048",
            "--json",
        ],
        ["--json", "-w", "2", "--tokens=1024", "2048", "--model", "llama3-8b", "gpt3-175b"],
    ]
    keys = []
    for args in spelled:
        result = runner.invoke(main, ["workloads", *args])
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout)
        assert payload["setup"]["tokens"] == [1024, 2048]
        keys.append([p["key"] for p in payload["problems"]])
    assert keys[0] == keys[1] == keys[2] and len(keys[0]) == 16
    # a value that is not one is still refused, naming the option
    result = runner.invoke(main, ["workloads", "-w", "2", "--tokens", "1024", "many"])
    assert result.exit_code == 2 and "--tokens" in result.output


def test_spell_out_repeats_stops_at_the_next_option_and_at_double_dash():
    from ficco.cli.common import spell_out_repeats

    flags = {"--tokens", "-t"}
    assert spell_out_repeats(["-t", "1", "2", "--json", "3"], flags) == [
        "-t", "1", "-t", "2", "--json", "3",
    ]  # fmt: skip
    assert spell_out_repeats(["--tokens=1", "2"], flags) == ["--tokens=1", "--tokens", "2"]
    assert spell_out_repeats(["--tokens", "1", "--", "2"], flags) == ["--tokens", "1", "--", "2"]


# Expected layer shapes of the added models, hand-computed from the configs cited in their
# entries. ag_gemm: N = per-rank output columns, K = hidden. gemm_rs: N = hidden, K = per-rank
# input columns. qkv = (heads/W + 2 * max(1, kv_heads/W)) * head_dim; a gated (SwiGLU) fc1
# holds 2 * ffn/W columns, a squared-ReLU one ffn/W.
EXPECTED_LAYERS = {
    ("mistral-large-2", 2): {
        "qkv": ("ag_gemm", (96 // 2 + 2 * (8 // 2)) * 128, 12288),  # 56 * 128 = 7168
        "out": ("gemm_rs", 12288, 96 * 128 // 2),  # K 6144
        "fc1": ("ag_gemm", 2 * 28672 // 2, 12288),  # 28672
        "fc2": ("gemm_rs", 12288, 28672 // 2),  # K 14336
    },
    ("mistral-large-2", 8): {
        "qkv": ("ag_gemm", (96 // 8 + 2 * (8 // 8)) * 128, 12288),  # 14 * 128 = 1792
        "out": ("gemm_rs", 12288, 96 * 128 // 8),  # K 1536
        "fc1": ("ag_gemm", 2 * 28672 // 8, 12288),  # 7168
        "fc2": ("gemm_rs", 12288, 28672 // 8),  # K 3584
    },
    # head_dim 18432 / 96 = 192; squared ReLU: fc1 is [hidden, ffn / W], no gate
    ("nemotron-4-340b", 2): {
        "qkv": ("ag_gemm", (96 // 2 + 2 * (8 // 2)) * 192, 18432),  # 56 * 192 = 10752
        "out": ("gemm_rs", 18432, 96 * 192 // 2),  # K 9216
        "fc1": ("ag_gemm", 73728 // 2, 18432),  # 36864, not 73728
        "fc2": ("gemm_rs", 18432, 73728 // 2),  # K 36864
    },
    ("nemotron-4-340b", 8): {
        "qkv": ("ag_gemm", (96 // 8 + 2 * (8 // 8)) * 192, 18432),  # 14 * 192 = 2688
        "out": ("gemm_rs", 18432, 96 * 192 // 8),  # K 2304
        "fc1": ("ag_gemm", 73728 // 8, 18432),  # 9216
        "fc2": ("gemm_rs", 18432, 73728 // 8),  # K 9216
    },
    # heads x head_dim = 64 x 128 = 8192 (twice hidden 4096); every layer MoE: no fc1/fc2
    ("qwen3-235b-a22b", 2): {
        "qkv": ("ag_gemm", (64 // 2 + 2 * (4 // 2)) * 128, 4096),  # 36 * 128 = 4608
        "out": ("gemm_rs", 4096, 64 * 128 // 2),  # K 4096
    },
    ("qwen3-235b-a22b", 8): {
        # 4 KV heads < 8 ranks: one replicated KV head per rank
        "qkv": ("ag_gemm", (64 // 8 + 2 * 1) * 128, 4096),  # 10 * 128 = 1280
        "out": ("gemm_rs", 4096, 64 * 128 // 8),  # K 1024
    },
    # heads x head_dim = 64 x 64 = 4096 != hidden 2880; every layer MoE: no fc1/fc2
    ("gpt-oss-120b", 2): {
        "qkv": ("ag_gemm", (64 // 2 + 2 * (8 // 2)) * 64, 2880),  # 40 * 64 = 2560
        "out": ("gemm_rs", 2880, 64 * 64 // 2),  # K 2048
    },
    ("gpt-oss-120b", 8): {
        "qkv": ("ag_gemm", (64 // 8 + 2 * (8 // 8)) * 64, 2880),  # 10 * 64 = 640
        "out": ("gemm_rs", 2880, 64 * 64 // 8),  # K 512
    },
    # dense layers: SwiGLU FFN 16384; MoE layers: one shared SwiGLU expert of 8192
    ("llama4-maverick", 2): {
        "qkv": ("ag_gemm", (40 // 2 + 2 * (8 // 2)) * 128, 5120),  # 28 * 128 = 3584
        "out": ("gemm_rs", 5120, 40 * 128 // 2),  # K 2560
        "fc1": ("ag_gemm", 2 * 16384 // 2, 5120),  # 16384
        "fc2": ("gemm_rs", 5120, 16384 // 2),  # K 8192
        "shared_fc1": ("ag_gemm", 2 * 8192 // 2, 5120),  # 8192
        "shared_fc2": ("gemm_rs", 5120, 8192 // 2),  # K 4096
    },
    ("llama4-maverick", 8): {
        "qkv": ("ag_gemm", (40 // 8 + 2 * (8 // 8)) * 128, 5120),  # 7 * 128 = 896
        "out": ("gemm_rs", 5120, 40 * 128 // 8),  # K 640
        "fc1": ("ag_gemm", 2 * 16384 // 8, 5120),  # 4096
        "fc2": ("gemm_rs", 5120, 16384 // 8),  # K 2048
        "shared_fc1": ("ag_gemm", 2 * 8192 // 8, 5120),  # 2048
        "shared_fc2": ("gemm_rs", 5120, 8192 // 8),  # K 1024
    },
}

# (experts, top_k, expert up-projection N = (2 if gated) * moe_ffn, K = hidden, down K = moe_ffn)
EXPECTED_EXPERTS = {
    "qwen3-235b-a22b": (128, 8, 2 * 1536, 4096, 1536),
    "gpt-oss-120b": (128, 4, 2 * 2880, 2880, 2880),
    "llama4-maverick": (128, 1, 2 * 8192, 5120, 8192),
}


@pytest.mark.parametrize(("model", "world"), sorted(EXPECTED_LAYERS))
def test_new_models_give_their_tensor_parallel_layer_shapes(model, world):
    problems, skipped = model_problems(get_model(model), ParallelSetup(world=world, tokens=(3072,)))
    assert not skipped
    tp = {
        p.name.split(".", 1)[1]: (p.pattern.value, p.n, p.k)
        for p in problems
        if p.pattern in (Pattern.AG_GEMM, Pattern.GEMM_RS)
    }
    assert tp == EXPECTED_LAYERS[(model, world)]
    assert all(p.world == world and p.m == 3072 for p in problems if not p.experts)


@pytest.mark.parametrize("world", [2, 8])
@pytest.mark.parametrize("model", sorted(EXPECTED_EXPERTS))
def test_new_moe_layers_are_all_to_all_problems_with_top_k_routed_tokens(model, world):
    experts, top_k, up_n, hidden, moe_ffn = EXPECTED_EXPERTS[model]
    tokens = 1536
    problems, skipped = model_problems(
        get_model(model), ParallelSetup(world=world, tokens=(tokens,))
    )
    assert not skipped
    layers = {p.name.split(".", 1)[1]: p for p in problems}
    up, down = layers["expert_up"], layers["expert_down"]
    assert (up.pattern, up.m, up.n, up.k) == (Pattern.A2A_GEMM, tokens * top_k, up_n, hidden)
    assert (down.pattern, down.m, down.n, down.k) == (
        Pattern.GEMM_A2A, tokens * top_k, hidden, moe_ffn,
    )  # fmt: skip
    assert up.experts == down.experts == experts and up.world == down.world == world
    assert up.experts_per_rank == experts // world and up.routing is None
    # uniform routing: every rank sends tokens * top_k / W of the routed tokens
    assert sum(up.routing_table()[0]) == tokens * top_k // world


def test_moe_only_models_have_no_dense_ffn_and_maverick_has_both():
    names = {
        model: {p.name.split(".", 1)[1] for p in model_problems(get_model(model), ParallelSetup(
            world=2, tokens=(2048,)))[0]}
        for model in EXPECTED_EXPERTS
    }  # fmt: skip
    # Qwen3-235B-A22B and GPT-OSS-120B: MoE in every layer, no shared expert
    assert names["qwen3-235b-a22b"] == {"qkv", "out", "expert_up", "expert_down"}
    assert names["gpt-oss-120b"] == {"qkv", "out", "expert_up", "expert_down"}
    # Llama-4-Maverick: dense layers alternate with MoE layers (routed + 1 shared expert)
    assert names["llama4-maverick"] == {
        "qkv", "out", "fc1", "fc2", "shared_fc1", "shared_fc2", "expert_up", "expert_down",
    }  # fmt: skip
    layout = {m: (MODELS[m].layers, MODELS[m].moe_layers) for m in (*NEW_MODELS, "deepseek-v3")}
    assert layout == {
        "mistral-large-2": (88, 0),
        "nemotron-4-340b": (96, 0),
        "qwen3-235b-a22b": (94, 94),
        "gpt-oss-120b": (36, 36),
        "llama4-maverick": (48, 24),  # interleave_moe_layer_step 2
        "deepseek-v3": (61, 58),  # first_k_dense_replace 3
    }


def test_layout_that_contradicts_the_ffns_is_refused():
    base = dict(name="x", hidden=64, heads=4, kv_heads=4, head_dim=16)
    with pytest.raises(ValueError, match="moe_layers: 4 MoE layers but experts=0"):
        ModelConfig(**base, ffn=128, layers=8, moe_layers=4)
    with pytest.raises(ValueError, match="ffn: 4 dense layers but ffn=0"):
        ModelConfig(**base, ffn=0, experts=8, top_k=2, moe_ffn=32, layers=8, moe_layers=4)
    with pytest.raises(ValueError, match="moe_layers: must lie in 0..layers=8"):
        ModelConfig(**base, ffn=0, experts=8, top_k=2, moe_ffn=32, layers=8, moe_layers=9)
    with pytest.raises(ValueError, match="moe_layers: needs layers"):
        ModelConfig(**base, ffn=0, experts=8, top_k=2, moe_ffn=32, moe_layers=4)


def test_default_tokens_span_256_to_32768_with_non_powers_of_two():
    assert DEFAULT_TOKENS[0] == 256 and DEFAULT_TOKENS[-1] == 32768
    assert list(DEFAULT_TOKENS) == sorted(set(DEFAULT_TOKENS))
    non_powers = [t for t in DEFAULT_TOKENS if t & (t - 1)]
    assert {1536, 3072, 6144, 12288, 24576} <= set(non_powers)
    assert ParallelSetup().tokens == DEFAULT_TOKENS


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_catalog_problem_constructs_at_two_four_and_eight_ranks(world):
    problems, skipped = catalog_problems(setup=ParallelSetup(world=world))
    assert skipped == []  # nothing refused with a ValueError, nothing that does not divide
    # one problem per layer kind and token count: none lost
    layer_kinds = sum(
        len({p.name for p in model_problems(m, ParallelSetup(world=world, tokens=(4096,)))[0]})
        for m in MODELS.values()
    )
    assert len(problems) == layer_kinds * len(DEFAULT_TOKENS)
    for p in problems:
        assert p.m % p.world == 0 and p.world == world
        assert p.m // (MODELS[p.name.split(".")[0]].top_k if p.experts else 1) in DEFAULT_TOKENS


def test_shipped_shapes_keep_their_names_and_keys():
    """The shipped store's problems (profiles/h200x2/shapes.csv) come out of the catalog with
    the same name and key, and the wide sweep's CSV holds every one of them."""
    root = Path(__file__).resolve().parents[1] / "profiles" / "h200x2"
    shipped = read_shapes_csv(root / "shapes.csv")
    tokens = tuple(sorted({p.m for p in shipped}))
    now, _ = catalog_problems(
        sorted({p.name.split(".")[0] for p in shipped}), ParallelSetup(world=2, tokens=tokens)
    )
    by_name = {(p.name, p.m): p.key for p in now}
    assert all(by_name[(p.name, p.m)] == p.key for p in shipped)
    wide = {p.key for p in read_shapes_csv(root / "shapes_wide.csv")}
    assert {p.key for p in shipped} <= wide


def test_wide_shapes_csv_is_what_the_catalog_gives_now():
    """profiles/h200x2/shapes_wide.csv = scripts/catalog_shapes.py's output: every catalog
    model's AG+GEMM and GEMM+RS layers at W = 2 over the default tokens."""
    path = Path(__file__).resolve().parents[1] / "profiles" / "h200x2" / "shapes_wide.csv"
    expected, skipped = catalog_problems(
        setup=ParallelSetup(world=2), patterns=("ag_gemm", "gemm_rs")
    )
    assert not skipped
    wide = read_shapes_csv(path)
    assert [(p.name, p.key) for p in wide] == [(p.name, p.key) for p in expected]
    assert {p.pattern for p in wide} == {Pattern.AG_GEMM, Pattern.GEMM_RS}
    assert {p.m for p in wide} == set(DEFAULT_TOKENS)
    assert {p.name.split(".")[0] for p in wide} == set(MODELS)


def test_catalog_problems_keeps_only_the_patterns_asked_for():
    setup = ParallelSetup(world=64, tokens=(1000, 4096))
    every, every_skip = catalog_problems(["mixtral-8x7b"], setup)
    tp, tp_skip = catalog_problems(["mixtral-8x7b"], setup, patterns=["ag_gemm", "gemm_rs"])
    assert tp == [p for p in every if p.pattern in (Pattern.AG_GEMM, Pattern.GEMM_RS)]
    assert tp_skip and all(s.pattern in (Pattern.AG_GEMM, Pattern.GEMM_RS) for s in tp_skip)
    # the expert layer's skip (8 experts over 64 ranks) belongs to a2a_gemm, not kept here
    assert any(s.name == "mixtral-8x7b.expert_up" for s in every_skip)
    assert not any(s.name == "mixtral-8x7b.expert_up" for s in tp_skip)


@pytest.mark.parametrize("model", NEW_MODELS)
def test_cli_workloads_prints_the_layers_of_a_new_model(model):
    result = CliRunner().invoke(
        main, ["workloads", "--model", model, "--world", "2", "--tokens", "3072"]
    )
    assert result.exit_code == 0, result.output
    expected, _ = model_problems(get_model(model), ParallelSetup(world=2, tokens=(3072,)))
    assert expected
    for p in expected:
        row = next(line for line in result.output.splitlines() if f" {p.name} " in line)
        assert f" {p.n} " in row and f" {p.k} " in row and f" {p.m} " in row
    assert "skipped" not in result.output


def test_inference_phases_give_the_row_parallel_layers_as_gemm_ar():
    """TP inference without SP: out-proj and fc2 all-reduce; nothing else communicates."""
    assert PHASE_TOKENS["decode"] == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    assert min(PHASE_TOKENS["prefill"]) > max(PHASE_TOKENS["decode"])
    setup = ParallelSetup(world=8, tokens=PHASE_TOKENS["decode"], phase="decode")
    problems, skipped = model_problems(get_model("llama3-70b"), setup)
    assert not skipped
    assert {p.pattern for p in problems} == {Pattern.GEMM_AR}
    assert {p.name for p in problems} == {"llama3-70b.out", "llama3-70b.fc2"}
    fc2 = [p for p in problems if p.name.endswith("fc2")]
    assert [p.m for p in fc2] == list(PHASE_TOKENS["decode"])
    assert (fc2[0].n, fc2[0].k, fc2[0].world) == (8192, 28672 // 8, 8)
    # the K of the training layer: the same row-parallel GEMM, another collective
    train, _ = model_problems(get_model("llama3-70b"), ParallelSetup(world=8, tokens=(4096,)))
    rs = next(p for p in train if p.name == "llama3-70b.fc2")
    assert (rs.pattern, rs.n, rs.k) == (Pattern.GEMM_RS, fc2[0].n, fc2[0].k)
    with pytest.raises(ValueError, match="phase: unknown phase 'train'"):
        ParallelSetup(world=2, phase="train")


def test_cli_workloads_phase_uses_the_phase_tokens_unless_given():
    runner = CliRunner()
    args = ["workloads", "--model", "llama3-8b", "-w", "2", "--json"]
    decode = json.loads(runner.invoke(main, [*args, "--phase", "decode"]).stdout)
    assert decode["setup"]["phase"] == "decode"
    assert decode["setup"]["tokens"] == list(PHASE_TOKENS["decode"])
    assert {p["pattern"] for p in decode["problems"]} == {"gemm_ar"}
    assert {p["m"] for p in decode["problems"]} == set(PHASE_TOKENS["decode"])
    prefill = json.loads(runner.invoke(main, [*args, "--phase", "prefill", "-t", "3000"]).stdout)
    assert [p["m"] for p in prefill["problems"]] == [3000, 3000]
