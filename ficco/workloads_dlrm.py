"""Recommendation models (DLRM): their embedding tables as emb_a2a problems.

A DLRM pools, per sample, one bag of indices from each of its sparse features' embedding
tables; with table-wise model parallelism (each GPU owns whole tables) the pooled rows then
go through an all-to-all so every GPU holds all tables' rows of its share of the batch
(``ficco.patterns.emb_a2a``). One problem per model and global batch: ``m`` the batch, ``n``
the embedding dim, ``k`` the largest bag, ``tables`` the rows of each table and ``bags`` each
table's bag size (the models below use one fixed size per table, as published).
"""

from __future__ import annotations

from dataclasses import dataclass

from ficco.problem import Pattern, Problem


@dataclass(frozen=True, kw_only=True, slots=True)
class EmbeddingModel:
    """The embedding layer of one recommendation model."""

    name: str
    tables: tuple[int, ...]
    """Rows of each sparse feature's table."""
    dim: int
    """Embedding dim (every table)."""
    bags: tuple[int, ...]
    """Indices per sample of each table (its pooling factor: 1 is one-hot)."""
    batches: tuple[int, ...]
    """Global batch sizes as published: one problem each."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        if len(self.bags) != len(self.tables):
            raise ValueError(f"bags: one per table for model {self.name!r}")
        if self.dim <= 0 or not self.batches or min(self.tables + self.bags + self.batches) < 1:
            raise ValueError(f"dim/tables/bags/batches: must be positive for model {self.name!r}")


# Sources: the reference implementations' command lines, where the numbers are published.
EMBEDDING_MODELS: dict[str, EmbeddingModel] = {
    m.name: m
    for m in (
        EmbeddingModel(
            name="dlrm-dcnv2",
            # MLPerf Training's recommendation benchmark (DLRM-DCNv2 on Criteo 1TB, multi-hot):
            # mlcommons/training recommendation_v2/torchrec_dlrm README,
            # --num_embeddings_per_feature, --multi_hot_sizes, --embedding_dim 128, and its
            # global batch size 65536
            tables=(
                40000000,
                39060,
                17295,
                7424,
                20265,
                3,
                7122,
                1543,
                63,
                40000000,
                3067956,
                405282,
                10,
                2209,
                11938,
                155,
                4,
                976,
                14,
                40000000,
                40000000,
                40000000,
                590152,
                12973,
                108,
                36,
            ),  # fmt: skip
            dim=128,
            bags=(
                3,
                2,
                1,
                2,
                6,
                1,
                1,
                1,
                1,
                7,
                3,
                8,
                1,
                6,
                9,
                5,
                1,
                1,
                1,
                12,
                100,
                27,
                10,
                3,
                1,
                1,
            ),
            batches=(65536,),
            source="mlcommons/training recommendation_v2/torchrec_dlrm (MLPerf DLRM-DCNv2)",
        ),
        EmbeddingModel(
            name="dlrm-kaggle",
            # facebookresearch/dlrm bench/dlrm_s_criteo_kaggle.sh: --arch-sparse-feature-size=16
            # (one-hot features), --mini-batch-size=128; the 26 tables' sizes are the Criteo
            # Kaggle (Display Advertising Challenge) categorical cardinalities the data loader
            # counts (dlrm_data_pytorch.py)
            tables=(
                1460,
                583,
                10131227,
                2202608,
                305,
                24,
                12517,
                633,
                3,
                93145,
                5683,
                8351593,
                3194,
                27,
                14992,
                5461306,
                10,
                5652,
                2173,
                4,
                7046547,
                18,
                15,
                286181,
                105,
                142572,
            ),  # fmt: skip
            dim=16,
            bags=(1,) * 26,
            batches=(128,),
            source="facebookresearch/dlrm bench/dlrm_s_criteo_kaggle.sh (Criteo Kaggle)",
        ),
    )
}


def embedding_problems(model: EmbeddingModel, world: int, dtype: str) -> tuple[list, list]:
    """``(problems, [(name, batch, reason), ...])``: one emb_a2a problem per published batch
    on ``world`` ranks, and those refused (with why)."""
    problems, refused = [], []
    name = f"{model.name}.embeddings"
    for batch in model.batches:
        try:
            problems.append(
                Problem(
                    pattern=Pattern.EMB_A2A,
                    m=batch,
                    n=model.dim,
                    k=max(model.bags),
                    world=world,
                    dtype=dtype,
                    tables=model.tables,
                    bags=model.bags,
                    name=name,
                )
            )
        except ValueError as err:
            refused.append((name, batch, str(err)))
    return problems, refused
