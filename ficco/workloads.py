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
from ficco.workloads_models import MODELS, ModelConfig

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


def field_columns_help() -> str:
    """The further columns, as the command line's help names them."""
    from ficco.patterns import problem_fields

    parts = []
    for name in field_columns():
        (_, declared), *_ = decls = problem_fields()[name]
        takers = ", ".join(str(p) for p, _ in decls)
        values = f"{' | '.join(declared.choices)}, " if declared.choices else ""
        parts.append(f"{name}: {takers}, {values}default {declared.default}")
    return "; ".join(parts)


def field_columns() -> tuple[str, ...]:
    """The further columns a shapes CSV may hold: the pattern fields declared a
    ``csv_column`` (gemm_ar's ``epilogue``), each one cell of command-line text, empty for
    its default (written only where some problem of the file sets it)."""
    from ficco.patterns import problem_fields

    return tuple(
        name for name, decls in problem_fields().items() if any(d.csv_column for _, d in decls)
    )


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

    written = [
        col for col in field_columns() if any(col in p.to_dict() for p in problems)
    ]  # a field at its implicit default is absent from the problem's dict
    columns = [*SHAPES_COLUMNS, *written]
    rows = [
        {col: p.to_dict().get(col, "") if col in written else getattr(p, col) for col in columns}
        for p in problems
    ]
    frame = pd.DataFrame(rows, columns=columns)
    frame["pattern"] = frame["pattern"].astype(str)
    frame["experts"] = frame["experts"].astype("Int64")
    frame.to_csv(path, index=False)


def read_shapes_csv(path: str | Path, notify: Callable[[str], None] | None = None) -> list[Problem]:
    """Problems from a shapes CSV (``ficco.tabular.csv_rows``); an InputError names the file,
    and the line and column of a bad cell. Of ``SHAPES_COLUMNS``, name, dtype and experts may
    be left out, and a pattern field's column (:func:`field_columns`) may be added; other
    columns are ignored, said once (``ficco.tabular.ignore_columns``)."""
    from ficco.patterns import problem_field
    from ficco.tabular import csv_rows, ignore_columns

    expect = ",".join(SHAPES_COLUMNS)
    header, rows = csv_rows("shapes", path, expect=expect)
    missing = [c for c in ("pattern", "m", "n", "k", "world") if c not in header]
    if missing:
        rule = f"lacks the column(s) {missing}; a shapes CSV has the columns {expect}"
        raise InputError("shapes", str(path), rule)
    fields = [c for c in field_columns() if c in header]
    known = (*SHAPES_COLUMNS, *fields)
    ignore_columns("shapes", path, [c for c in header if c not in known], notify)
    problems = []
    for line_no, row in rows:
        cells = {col: row.get(col, "").strip() for col in known}
        try:
            # a cell is text: integers are parsed here, so Problem sees numbers (never 64.7
            # truncated to 64)
            sizes = {col: validate.integer(col, cells[col]) for col in ("m", "n", "k", "world")}
            experts = validate.integer("experts", cells["experts"]) if cells["experts"] else None
            declared = {  # an empty cell: the field's default (a pattern without it: absent)
                col: problem_field(cells["pattern"], col).parse(cells[col])
                for col in fields
                if cells[col]
            }
            problems.append(
                Problem(
                    pattern=cells["pattern"],
                    **sizes,
                    dtype=cells["dtype"] or "bf16",
                    experts=experts,
                    name=cells["name"],
                    **declared,
                )
            )
        except (ValueError, TypeError) as err:
            raise InputError("shapes", None, f"{path}: line {line_no}: {err}") from None
    return problems
