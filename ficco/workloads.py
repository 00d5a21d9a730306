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

A combination that does not divide (heads over ranks, features over ranks, experts over EP
ranks, tokens over ranks) is skipped with the reason, never rounded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ficco.problem import Pattern, Problem, canonical_dtype

#: Token counts of the TP group (sequence length x micro-batch) swept by default.
DEFAULT_TOKENS: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)

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

    @property
    def is_moe(self) -> bool:
        return self.experts > 0


# Sources: the Hugging Face config.json of each checkpoint, or the paper where none exists.
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
            source="huggingface.co/meta-llama/Meta-Llama-3-8B config.json",
        ),
        ModelConfig(
            name="llama3-70b",
            hidden=8192,
            ffn=28672,
            heads=64,
            kv_heads=8,
            head_dim=128,
            source="huggingface.co/meta-llama/Meta-Llama-3-70B config.json",
        ),
        ModelConfig(
            name="llama3-405b",
            hidden=16384,
            ffn=53248,
            heads=128,
            kv_heads=8,
            head_dim=128,
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
            source="huggingface.co/deepseek-ai/DeepSeek-V3 config.json",
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

    def __post_init__(self) -> None:
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


def _layers(model: ModelConfig, w: int) -> tuple[list[_Layer], list[tuple[str, str]]]:
    """The layers of ``model`` at TP degree ``w``, and (layer, reason) for those that don't fit."""
    layers: list[_Layer] = []
    bad: list[tuple[str, str]] = []
    qkv_cols, why = _attention_qkv_columns(model, w)
    if why:
        bad += [("qkv", why), ("out", why)]
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
            bad += [(up, why), (down, why)]
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


def get_model(name: str) -> ModelConfig:
    """The catalog entry called ``name`` (ValueError listing the known names otherwise)."""
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(
            f"model: unknown model {name!r}; expected one of {', '.join(MODELS)}"
        ) from None


def model_problems(model: ModelConfig, setup: ParallelSetup) -> tuple[list[Problem], list[Skipped]]:
    """Every layer's problem of ``model`` at each token count, and what was skipped (why)."""
    problems: list[Problem] = []
    skipped: list[Skipped] = []
    layers, bad = _layers(model, setup.world)
    for tokens in setup.tokens:
        for layer, reason in bad:
            skipped.append(Skipped(f"{model.name}.{layer}", tokens, reason))
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
                skipped.append(Skipped(name, tokens, str(err)))
    return problems, skipped


def catalog_problems(
    models: Iterable[str] | None = None, setup: ParallelSetup | None = None
) -> tuple[list[Problem], list[Skipped]]:
    """Problems of the named models (all of the catalog when None) under ``setup``."""
    setup = setup or ParallelSetup()
    names = list(models) if models else list(MODELS)
    problems: list[Problem] = []
    skipped: list[Skipped] = []
    for name in names:
        got, skip = model_problems(get_model(name), setup)
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
    """Write ``problems`` as a shapes CSV (columns ``SHAPES_COLUMNS``)."""
    import pandas as pd

    rows = [{col: getattr(p, col) for col in SHAPES_COLUMNS} for p in problems]
    frame = pd.DataFrame(rows, columns=list(SHAPES_COLUMNS))
    frame["pattern"] = frame["pattern"].astype(str)
    frame["experts"] = frame["experts"].astype("Int64")
    frame.to_csv(path, index=False)


def read_shapes_csv(path: str | Path) -> list[Problem]:
    """Problems from a shapes CSV; ValueError naming the row and the rule for a bad row."""
    import pandas as pd

    frame = pd.read_csv(path, dtype={"name": str, "pattern": str, "dtype": str})
    missing = [c for c in ("pattern", "m", "n", "k", "world") if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: shapes CSV lacks column(s) {missing}; needs {SHAPES_COLUMNS}")
    problems = []
    for index, row in frame.iterrows():
        experts = row.get("experts")
        try:
            problems.append(
                Problem(
                    pattern=row["pattern"],
                    m=int(row["m"]),
                    n=int(row["n"]),
                    k=int(row["k"]),
                    world=int(row["world"]),
                    dtype=row["dtype"] if pd.notna(row.get("dtype")) else "bf16",
                    experts=int(experts) if pd.notna(experts) else None,
                    name=row["name"] if pd.notna(row.get("name")) else "",
                )
            )
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}: row {int(index) + 2}: {err}") from None
    return problems
