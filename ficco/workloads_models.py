"""The transformer configurations ficco's workloads come from: one :class:`ModelConfig` per
model, each field cited to its source (``MODELS``). ``ficco.workloads`` turns them into the
GEMM + collective problems of their layers; ``ficco.workloads_dlrm`` holds the embedding
models.
"""

from __future__ import annotations

from dataclasses import dataclass


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
