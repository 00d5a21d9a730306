"""Real model configurations turned into the GEMM + collective problems of one layer.

A transformer layer under tensor + sequence parallelism (Megatron-style, degree ``W``) runs:

=============  ==========  ================================================================
layer          pattern     GEMM as each rank computes it (``T`` tokens of the TP group)
=============  ==========  ================================================================
``qkv``        ag_gemm     ``[T, hidden] @ [hidden, qkv_out / W]`` after all-gathering tokens
``out``        gemm_rs     ``[T, heads*head_dim / W] @ [heads*head_dim / W, hidden]``, then RS
``fc1``        ag_gemm     ``[T, hidden] @ [hidden, (2 if gated) * ffn / W]``
``fc2``        gemm_rs     ``[T, ffn / W] @ [ffn / W, hidden]``, then reduce-scatter
=============  ==========  ================================================================

``N`` of a column-parallel layer is the per-rank share of the output features, ``K`` of a
row-parallel layer the per-rank slice of the reduced input features. Gated FFNs (SwiGLU) fuse
gate and up projections into one ``fc1`` with twice the columns, as Megatron's
``linear_fc1`` does. When there are fewer key/value heads than ranks, every rank keeps one
replicated key/value head (what Megatron and vLLM do), so ``qkv`` gets
``(heads/W + 2 * max(1, kv_heads/W)) * head_dim`` columns.

Mixture-of-experts layers, with expert parallelism of degree ``EP`` (default ``W``):

=================  ==========  ============================================================
``expert_up``      a2a_gemm    dispatch ``T * top_k`` routed tokens, expert up-projection
                               ``[hidden, (2 if gated) * moe_ffn]``
``expert_down``    gemm_a2a    expert down-projection ``[moe_ffn, hidden]``, then combine
``shared_fc1/2``   ag/rs       shared experts, tensor-parallel like a dense FFN
=================  ==========  ============================================================

Routing is uniform (every rank sends ``T * top_k / EP`` tokens spread evenly over all experts).

Models mix layer kinds: Mixtral, Qwen3-235B-A22B and GPT-OSS-120B are MoE in every layer (no
dense ``fc1``/``fc2``); DeepSeek-V3 has 3 dense layers then 58 MoE layers; Llama-4-Maverick
alternates dense and MoE layers, its MoE layers adding one shared expert. ``layers`` and
``moe_layers`` record the layout; each layer kind gives one problem per token count.

Inference (``phase`` decode or prefill): tensor parallelism without sequence parallelism, as
vLLM-like engines run it. Column-parallel layers read replicated activations and communicate
nothing; each row-parallel layer (``out``, ``fc2``, ``shared_fc2``) is a ``gemm_ar`` problem,
``[T, in / W] @ [in / W, hidden]`` then all-reduce, at the phase's token counts
(``PHASE_TOKENS``). Expert layers are left out of the inference phases.

A combination that does not divide (heads over ranks, features over ranks, experts over EP
ranks, tokens over ranks) is skipped with the reason, never rounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ficco import validate
from ficco.problem import Pattern, Problem, canonical_dtype, parse_pattern
from ficco.validate import InputError
from ficco.workloads_dlrm import EMBEDDING_MODELS, EmbeddingModel, embedding_problems

#: Token counts of the TP group (sequence length x micro-batch) swept by default: 256 to
#: 32768: powers of two, and from 1024 up the 1.5x steps between them (1536 ... 24576), so a
#: selector sees non-power-of-two M and shapes well past the 8192 of the first sweep
#: (prefill and sequence-parallel training run 16K-128K tokens per TP group). Every count
#: is a multiple of 256, so M / W is whole for any W dividing 256 (W = 2, 4, 8 included)
#: and the routed-token count T * top_k of a MoE layer splits evenly over EP ranks as well.
DEFAULT_TOKENS: tuple[int, ...] = (
    256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
)  # fmt: skip

#: Token counts per inference phase: a decode step's batch (1 ... 512 sequences, one token
#: each) and prefill chunks above it. gemm_ar needs no M divisible by W, so odd batches fit.
PHASE_TOKENS: dict[str, tuple[int, ...]] = {
    "decode": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    "prefill": (1024, 2048, 4096, 8192, 16384),
}

#: Columns of the shapes CSV that ``ficco workloads --csv`` writes and ``ficco sweep --shapes``
#: reads.
SHAPES_COLUMNS = ("name", "pattern", "m", "n", "k", "world", "dtype", "experts")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """The layer sizes of one model that decide its GEMM + collective shapes."""

    name: str
    """Short name, the prefix of every problem name (``llama3-70b`` -> ``llama3-70b.fc1``)."""
    hidden: int
    """Model (residual stream) width."""
    ffn: int
    """Intermediate size of the dense FFN; 0 when every layer is MoE."""
    heads: int
    """Attention (query) heads."""
    kv_heads: int
    """Key/value heads (equal to ``heads`` without grouped-query attention)."""
    head_dim: int
    """Width of one attention head."""
    gated: bool = True
    """SwiGLU-style FFN: fc1 holds gate and up projections (2 x ffn columns)."""
    experts: int = 0
    """Routed experts per MoE layer (0: dense model)."""
    top_k: int = 0
    """Experts each token is routed to."""
    moe_ffn: int = 0
    """Intermediate size of one expert."""
    shared_experts: int = 0
    """Experts every token passes through, tensor-parallel like a dense FFN."""
    attn_in_replicated: int = 0
    """Multi-head latent attention: columns of the fused query and key/value down-projections,
    which every rank computes in full (not split by W); 0 for ordinary attention."""
    layers: int = 0
    """Decoder layers (0: not recorded). Only the layout check reads it: every layer of one
    kind has the same shapes, so each kind gives one problem per token count."""
    moe_layers: int = 0
    """How many of ``layers`` route tokens to experts; the other ``layers - moe_layers`` run
    the dense FFN (``ffn``)."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        for fname in ("hidden", "heads", "kv_heads", "head_dim"):
            if getattr(self, fname) <= 0:
                raise ValueError(f"{fname}: must be positive for model {self.name!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads: must divide heads for model {self.name!r}")
        if self.experts and (self.top_k <= 0 or self.moe_ffn <= 0):
            raise ValueError(f"top_k/moe_ffn: an MoE model ({self.name!r}) needs both")
        if not self.experts and not self.ffn:
            raise ValueError(f"ffn: a dense model ({self.name!r}) needs an FFN size")
        self._check_layout()

    def _check_layout(self) -> None:
        """The layer counts, when recorded, must agree with which FFNs the model has."""
        if not self.layers:
            if self.moe_layers:
                raise ValueError(f"moe_layers: needs layers for model {self.name!r}")
            return
        if not 0 <= self.moe_layers <= self.layers:
            raise ValueError(
                f"moe_layers: must lie in 0..layers={self.layers} for model {self.name!r}, "
                f"got {self.moe_layers}"
            )
        if bool(self.moe_layers) != self.is_moe:
            raise ValueError(
                f"moe_layers: {self.moe_layers} MoE layers but experts={self.experts} "
                f"for model {self.name!r}; both zero or both positive"
            )
        if bool(self.dense_layers) != bool(self.ffn):
            raise ValueError(
                f"ffn: {self.dense_layers} dense layers but ffn={self.ffn} for model "
                f"{self.name!r}; a dense FFN size exactly when some layers are dense"
            )

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def dense_layers(self) -> int:
        """Layers that run the dense FFN (0 when the layout is not recorded)."""
        return self.layers - self.moe_layers


# Sources: the config.json on each checkpoint's official hub page, or the paper or the
# developer's own code where that is where the numbers are published. Each entry names the
# fields it took.
MODELS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        ModelConfig(
            name="llama3-8b",
            hidden=4096,
            ffn=14336,
            heads=32,
            kv_heads=8,
            head_dim=128,
            layers=32,
            source="huggingface.co/meta-llama/Meta-Llama-3-8B config.json",
        ),
        ModelConfig(
            name="llama3-70b",
            hidden=8192,
            ffn=28672,
            heads=64,
            kv_heads=8,
            head_dim=128,
            layers=80,
            source="huggingface.co/meta-llama/Meta-Llama-3-70B config.json",
        ),
        ModelConfig(
            name="llama3-405b",
            hidden=16384,
            ffn=53248,
            heads=128,
            kv_heads=8,
            head_dim=128,
            layers=126,
            source="huggingface.co/meta-llama/Llama-3.1-405B config.json",
        ),
        # Same layer shapes as llama3-70b (GQA with 8 KV heads); the sweep measures them once.
        ModelConfig(
            name="llama2-70b",
            hidden=8192,
            ffn=28672,
            heads=64,
            kv_heads=8,
            head_dim=128,
            layers=80,
            source="huggingface.co/meta-llama/Llama-2-70b-hf config.json",
        ),
        ModelConfig(
            name="gpt3-175b",
            hidden=12288,
            ffn=4 * 12288,
            heads=96,
            kv_heads=96,
            head_dim=128,
            gated=False,
            layers=96,
            source="Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1 "
            "(d_model 12288, 96 heads of 128, FFN 4 x d_model, GeLU)",
        ),
        ModelConfig(
            name="mixtral-8x7b",
            hidden=4096,
            ffn=0,
            heads=32,
            kv_heads=8,
            head_dim=128,
            experts=8,
            top_k=2,
            moe_ffn=14336,
            layers=32,
            moe_layers=32,
            source="huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json",
        ),
        # Dense FFN of the first 3 layers (first_k_dense_replace), MoE in the other 58.
        # MLA: q_lora_rank 1536 + kv_lora_rank 512 + qk_rope_head_dim 64 down-projection
        # columns; out-proj reads heads x v_head_dim = 128 x 128.
        ModelConfig(
            name="deepseek-v3",
            hidden=7168,
            ffn=18432,
            heads=128,
            kv_heads=128,
            head_dim=128,
            experts=256,
            top_k=8,
            moe_ffn=2048,
            shared_experts=1,
            attn_in_replicated=1536 + 512 + 64,
            layers=61,
            moe_layers=58,
            source="huggingface.co/deepseek-ai/DeepSeek-V3 config.json",
        ),
        # Dense, SwiGLU. heads x head_dim = 96 x 128 = hidden.
        ModelConfig(
            name="mistral-large-2",
            hidden=12288,
            ffn=28672,
            heads=96,
            kv_heads=8,
            head_dim=128,
            layers=88,
            source="huggingface.co/mistralai/Mistral-Large-Instruct-2407 config.json "
            "(hidden_size 12288, intermediate_size 28672, num_attention_heads 96, "
            "num_key_value_heads 8, num_hidden_layers 88, silu/SwiGLU; head_dim 12288/96 = 128), "
            "a page behind a licence click; cross-checked with the params.json of Mistral's "
            "Pixtral-Large (built on Mistral Large 2) as quoted in an AWS Neuron sample: dim "
            "12288, hidden_dim 28672, n_heads 96, n_kv_heads 8, head_dim 128, n_layers 88",
        ),
        # Dense, squared-ReLU MLP without a gate: fc1 is [hidden, ffn], not 2 x ffn.
        # kv_channels unset, so head_dim = hidden / heads = 18432 / 96 = 192.
        ModelConfig(
            name="nemotron-4-340b",
            hidden=18432,
            ffn=73728,
            heads=96,
            kv_heads=8,
            head_dim=192,
            gated=False,
            layers=96,
            source="NVIDIA, 'Nemotron-4 340B Technical Report' (arXiv:2406.11704), Table 1 "
            "(96 layers, hidden 18432, 96 attention heads, 8 KV heads) and Sec. 2.1 "
            "(squared-ReLU MLP); ffn_hidden_size 73728 from Nemotron4ModelProvider340B in "
            "NVIDIA-NeMo/Megatron-Bridge (models/nemotron/nemotron_provider.py), which also "
            "sets activation squared_relu, num_query_groups 8, kv_channels None",
        ),
        # Every layer is MoE (decoder_sparse_step 1, mlp_only_layers []): the config's
        # intermediate_size 12288 is never instantiated, so no dense fc1/fc2. No shared
        # expert. heads x head_dim = 64 x 128 = 8192, twice hidden: out-proj K = 8192 / W.
        ModelConfig(
            name="qwen3-235b-a22b",
            hidden=4096,
            ffn=0,
            heads=64,
            kv_heads=4,
            head_dim=128,
            experts=128,
            top_k=8,
            moe_ffn=1536,
            layers=94,
            moe_layers=94,
            source="huggingface.co/Qwen/Qwen3-235B-A22B config.json and model card "
            "(hidden_size 4096, num_attention_heads 64, num_key_value_heads 4, head_dim 128, "
            "num_experts 128, num_experts_per_tok 8, moe_intermediate_size 1536, "
            "num_hidden_layers 94, decoder_sparse_step 1, mlp_only_layers []); Qwen3 "
            "Technical Report (arXiv:2505.09388) Table 2 and Sec. 2 (no shared experts)",
        ),
        # Every layer is MoE; SwiGLU experts (mlp1 holds 2 x intermediate_size rows), no
        # shared expert. heads x head_dim = 64 x 64 = 4096 != hidden 2880.
        ModelConfig(
            name="gpt-oss-120b",
            hidden=2880,
            ffn=0,
            heads=64,
            kv_heads=8,
            head_dim=64,
            experts=128,
            top_k=4,
            moe_ffn=2880,
            layers=36,
            moe_layers=36,
            source="huggingface.co/openai/gpt-oss-120b config.json (hidden_size 2880, "
            "intermediate_size 2880, num_attention_heads 64, num_key_value_heads 8, head_dim 64, "
            "num_local_experts 128, num_experts_per_tok 4, num_hidden_layers 36); the same "
            "values are ModelConfig's defaults in github.com/openai/gpt-oss "
            "(gpt_oss/torch/model.py), whose MLPBlock is MoE in every layer",
        ),
        # interleave_moe_layer_step 2: 24 dense layers (SwiGLU, intermediate_size_mlp 16384)
        # alternate with 24 MoE layers (128 routed experts of 8192, top-1, plus one shared
        # expert of 8192 that every token passes through).
        ModelConfig(
            name="llama4-maverick",
            hidden=5120,
            ffn=16384,
            heads=40,
            kv_heads=8,
            head_dim=128,
            experts=128,
            top_k=1,
            moe_ffn=8192,
            shared_experts=1,
            layers=48,
            moe_layers=24,
            source="huggingface.co/meta-llama/Llama-4-Maverick-17B-128E config.json "
            "(text_config: hidden_size 5120, intermediate_size 8192, intermediate_size_mlp "
            "16384, num_attention_heads 40, num_key_value_heads 8, head_dim 128, "
            "num_local_experts 128, num_experts_per_tok 1, interleave_moe_layer_step 2, "
            "num_hidden_layers 48); the same in pytorch/torchtune llama4_maverick_17b_128e "
            "(use_shared_expert True, moe_every_n_layers 2, mlp_hidden_dim 16384); Meta's "
            "release post ai.meta.com/blog/llama-4-multimodal-intelligence: alternating dense "
            "and MoE layers, each token goes to the shared expert and one of 128 routed experts",
        ),
    )
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelSetup:
    """How a model is spread over GPUs."""

    world: int = 8
    """Tensor/sequence-parallel degree W (ranks of every ag_gemm and gemm_rs)."""
    ep: int | None = None
    """Expert-parallel degree (ranks of every all-to-all); None: the same as ``world``."""
    tokens: tuple[int, ...] = DEFAULT_TOKENS
    """Tokens of the TP group per step (sequence length x micro-batch), one problem each."""
    dtype: str = "bf16"
    """Element type of every problem."""
    phase: str | None = None
    """None: training layers (tensor + sequence parallel); 'decode' or 'prefill': inference
    (tensor parallel only), whose row-parallel layers are gemm_ar problems."""

    def __post_init__(self) -> None:
        if self.phase is not None and self.phase not in PHASE_TOKENS:
            raise ValueError(
                f"phase: unknown phase {self.phase!r}; expected one of {', '.join(PHASE_TOKENS)}"
            )
        if self.world < 2:
            raise ValueError(f"world: needs at least 2 ranks, got {self.world}")
        if self.ep is not None and self.ep < 2:
            raise ValueError(f"ep: expert parallelism needs at least 2 ranks, got {self.ep}")
        if not self.tokens or any(t <= 0 for t in self.tokens):
            raise ValueError(f"tokens: needs positive token counts, got {self.tokens}")
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    @property
    def ep_world(self) -> int:
        return self.ep or self.world


@dataclass(frozen=True, slots=True)
class Skipped:
    """A layer x token count that does not divide over the ranks, and why."""

    name: str
    tokens: int
    reason: str
    pattern: Pattern | None = None
    """The pattern the layer would have had."""


@dataclass(frozen=True, slots=True)
class _Layer:
    layer: str
    pattern: Pattern
    n: int
    k: int
    moe: bool = False


def _attention_qkv_columns(model: ModelConfig, w: int) -> tuple[int, str | None]:
    if model.attn_in_replicated:
        return model.attn_in_replicated, None
    if model.heads % w:
        return 0, f"{model.heads} attention heads do not split over W={w} ranks"
    if model.kv_heads % w and w % model.kv_heads:
        return 0, f"{model.kv_heads} key/value heads neither split over nor replicate to W={w}"
    kv_per_rank = max(1, model.kv_heads // w)
    return (model.heads // w + 2 * kv_per_rank) * model.head_dim, None


def _layers(model: ModelConfig, w: int) -> tuple[list[_Layer], list[tuple[str, Pattern, str]]]:
    """The layers of ``model`` at TP degree ``w``, and (layer, pattern, reason) for those that
    don't fit."""
    layers: list[_Layer] = []
    bad: list[tuple[str, Pattern, str]] = []
    qkv_cols, why = _attention_qkv_columns(model, w)
    if why:
        bad += [("qkv", Pattern.AG_GEMM, why), ("out", Pattern.GEMM_RS, why)]
    else:
        layers.append(_Layer("qkv", Pattern.AG_GEMM, qkv_cols, model.hidden))
        attn = model.heads * model.head_dim
        layers.append(_Layer("out", Pattern.GEMM_RS, model.hidden, attn // w))
    ffns = []
    if model.ffn:
        ffns.append(("fc1", "fc2", model.ffn))
    if model.shared_experts:
        ffns.append(("shared_fc1", "shared_fc2", model.shared_experts * model.moe_ffn))
    for up, down, width in ffns:
        if width % w:
            why = f"{width} FFN features do not split over W={w} ranks"
            bad += [(up, Pattern.AG_GEMM, why), (down, Pattern.GEMM_RS, why)]
            continue
        cols = (2 if model.gated else 1) * (width // w)
        layers.append(_Layer(up, Pattern.AG_GEMM, cols, model.hidden))
        layers.append(_Layer(down, Pattern.GEMM_RS, model.hidden, width // w))
    if model.is_moe:
        up_cols = (2 if model.gated else 1) * model.moe_ffn
        layers.append(_Layer("expert_up", Pattern.A2A_GEMM, up_cols, model.hidden, moe=True))
        layers.append(
            _Layer("expert_down", Pattern.GEMM_A2A, model.hidden, model.moe_ffn, moe=True)
        )
    return layers, bad


#: every model name: the transformers ("all") and the DLRMs (``ficco.workloads_dlrm``)
CATALOG: tuple[str, ...] = (*MODELS, *EMBEDDING_MODELS)


def get_model(name: str) -> ModelConfig | EmbeddingModel:
    """The catalog entry called ``name`` (ValueError listing the known names otherwise)."""
    try:
        return EMBEDDING_MODELS.get(name.lower()) or MODELS[name.lower()]
    except KeyError:
        raise ValueError(
            f"model: unknown model {name!r}; expected one of {', '.join(CATALOG)}"
        ) from None


def model_problems(model: ModelConfig | EmbeddingModel, setup: ParallelSetup) -> tuple[list, list]:
    """Every layer's problem of ``model`` at each token count (a DLRM: its embeddings at its
    published batches), and what was skipped (why)."""
    problems: list[Problem] = []
    skipped: list[Skipped] = []
    if isinstance(model, EmbeddingModel):
        problems, refused = embedding_problems(model, setup.ep_world, setup.dtype)
        return problems, [Skipped(n, b, why, Pattern.EMB_A2A) for n, b, why in refused]
    layers, bad = _layers(model, setup.world)
    if setup.phase is not None:  # inference: only the row-parallel layers communicate
        layers = [
            _Layer(x.layer, Pattern.GEMM_AR, x.n, x.k)
            for x in layers
            if x.pattern is Pattern.GEMM_RS
        ]
        bad = [(name, Pattern.GEMM_AR, why) for name, pat, why in bad if pat is Pattern.GEMM_RS]
    for tokens in setup.tokens:
        for layer, pattern, reason in bad:
            skipped.append(Skipped(f"{model.name}.{layer}", tokens, reason, pattern))
        for layer in layers:
            name = f"{model.name}.{layer.layer}"
            kwargs = dict(
                pattern=layer.pattern,
                n=layer.n,
                k=layer.k,
                dtype=setup.dtype,
                name=name,
            )
            if layer.moe:
                kwargs.update(m=tokens * model.top_k, world=setup.ep_world, experts=model.experts)
            else:
                kwargs.update(m=tokens, world=setup.world)
            try:
                problems.append(Problem(**kwargs))
            except ValueError as err:
                skipped.append(Skipped(name, tokens, str(err), layer.pattern))
    return problems, skipped


def catalog_problems(
    models: Iterable[str] | None = None,
    setup: ParallelSetup | None = None,
    *,
    patterns: Iterable[Pattern | str] | None = None,
) -> tuple[list[Problem], list[Skipped]]:
    """Problems of the named models (all of the catalog when None) under ``setup``; with
    ``patterns``, only the problems of those patterns (e.g. ag_gemm and gemm_rs for a
    tensor-parallel sweep), and only their skips."""
    setup = setup or ParallelSetup()
    names = list(models) if models else list(MODELS)
    wanted = {parse_pattern(p) for p in patterns} if patterns is not None else None
    problems: list[Problem] = []
    skipped: list[Skipped] = []
    for name in names:
        model = get_model(name)
        got, skip = model_problems(model, setup)
        if wanted is not None:
            got = [p for p in got if p.pattern in wanted]
            skip = [s for s in skip if s.pattern in wanted]
        problems += got
        skipped += skip
    return problems, skipped


def unique_problems(problems: Iterable[Problem]) -> tuple[list[Problem], dict[str, str]]:
    """The first problem of each shape (``Problem.key``), and ``{dropped name: kept name}``
    for later problems of a shape already seen (e.g. llama2-70b's layers are llama3-70b's)."""
    kept: dict[str, Problem] = {}
    aliases: dict[str, str] = {}
    for p in problems:
        if p.key in kept:
            if p.name != kept[p.key].name:
                aliases[f"{p.name}@{p.m}"] = f"{kept[p.key].name}@{kept[p.key].m}"
        else:
            kept[p.key] = p
    return list(kept.values()), aliases


def write_shapes_csv(problems: Iterable[Problem], path: str | Path) -> None:
    """Write ``problems`` as a shapes CSV (columns ``SHAPES_COLUMNS``; it has no tables
    column, so an emb_a2a problem is refused)."""
    import pandas as pd

    problems = list(problems)
    if tabled := [p.name or p.key for p in problems if p.tables is not None]:
        raise InputError("csv", tabled, "a shapes CSV has no tables column: emb_a2a is not kept")

    rows = [{col: getattr(p, col) for col in SHAPES_COLUMNS} for p in problems]
    frame = pd.DataFrame(rows, columns=list(SHAPES_COLUMNS))
    frame["pattern"] = frame["pattern"].astype(str)
    frame["experts"] = frame["experts"].astype("Int64")
    frame.to_csv(path, index=False)


def read_shapes_csv(path: str | Path, notify: Callable[[str], None] | None = None) -> list[Problem]:
    """Problems from a shapes CSV (``ficco.tabular.csv_rows``); an InputError names the file,
    and the line and column of a bad cell. Of ``SHAPES_COLUMNS``, name, dtype and experts may
    be left out; other columns are ignored, said once (``ficco.tabular.ignore_columns``)."""
    from ficco.tabular import csv_rows, ignore_columns

    expect = ",".join(SHAPES_COLUMNS)
    header, rows = csv_rows("shapes", path, expect=expect)
    missing = [c for c in ("pattern", "m", "n", "k", "world") if c not in header]
    if missing:
        rule = f"lacks the column(s) {missing}; a shapes CSV has the columns {expect}"
        raise InputError("shapes", str(path), rule)
    ignore_columns("shapes", path, [c for c in header if c not in SHAPES_COLUMNS], notify)
    problems = []
    for line_no, row in rows:
        cells = {col: row.get(col, "").strip() for col in SHAPES_COLUMNS}
        try:
            # a cell is text: integers are parsed here, so Problem sees numbers (never 64.7
            # truncated to 64)
            sizes = {col: validate.integer(col, cells[col]) for col in ("m", "n", "k", "world")}
            experts = validate.integer("experts", cells["experts"]) if cells["experts"] else None
            problems.append(
                Problem(
                    pattern=cells["pattern"],
                    **sizes,
                    dtype=cells["dtype"] or "bf16",
                    experts=experts,
                    name=cells["name"],
                )
            )
        except (ValueError, TypeError) as err:
            raise InputError("shapes", None, f"{path}: line {line_no}: {err}") from None
    return problems
