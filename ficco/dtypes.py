"""Element types: every fact ficco knows of a problem's dtype, in one record per dtype.

A problem's ``dtype`` names the element type of its GEMM's inputs. Plain dtypes (fp32, fp16,
bf16) are also the type of the output and of every partial a collective moves or reduces.
Scaled dtypes (fp8 e4m3 and e5m2) hold their inputs as 8-bit floats times fp32 scales
(``ficco.problem.Scale`` says which granularity each side takes); the GEMM dequantizes,
accumulates in fp32 and writes ``output`` (bf16), so an all-gather moves the 1-byte shard and
its scales while a reduce-scatter or all-reduce moves and reduces bf16 partials. Verification
derives its tolerance from the output dtype (the roundings happen there).

To add a dtype: one :class:`DType` in :data:`DTYPES`; the stdlib lookup's width and alias
tables (``ficco.export.lookup_features``) are held to it by ``tests/test_fp8_dtypes.py``. No table
holds a scaled dtype's features yet: the selector refuses them (``ficco.select.features``),
so the lookup's one width per dtype (its sizes twins move ``b``-byte rows) stays right.

Torch is never imported here: the record names torch's dtype by its attribute name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DType:
    """One element type's traits."""

    name: str
    """Canonical name, as problems, keys and tables spell it."""
    bytes: int
    """Bytes per input element."""
    torch_name: str
    """Attribute of ``torch`` holding its tensor dtype."""
    aliases: tuple[str, ...] = ()
    """Other spellings accepted (``bfloat16``, ``torch.float8_e4m3fn``...)."""
    scaled: bool = False
    """Inputs are quantized: each side carries fp32 scales, dequantized inside the GEMM."""
    output: str = ""
    """The dtype the GEMM writes and collectives move after it ("": the dtype itself)."""
    largest: float = 0.0
    """Largest finite value (scaled dtypes: what a scale maps an operand's max onto)."""
    min_capability: tuple[int, int] | None = None
    """The CUDA compute capability its GEMMs need (None: every GPU ficco runs on)."""

    @property
    def output_name(self) -> str:
        return self.output or self.name


#: every dtype ficco knows, by canonical name
DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("bf16", 2, "bfloat16", aliases=("bfloat16",)),
        DType("fp16", 2, "float16", aliases=("float16", "half")),
        DType("fp32", 4, "float32", aliases=("float32", "float")),
        DType(
            "fp8_e4m3",
            1,
            "float8_e4m3fn",
            aliases=("float8_e4m3fn",),
            scaled=True,
            output="bf16",
            largest=448.0,
            min_capability=(8, 9),
        ),
        DType(
            "fp8_e5m2",
            1,
            "float8_e5m2",
            aliases=("float8_e5m2",),
            scaled=True,
            output="bf16",
            largest=57344.0,
            min_capability=(8, 9),
        ),
    )
}

_ALIASES = {alias: d.name for d in DTYPES.values() for alias in d.aliases}

#: scaled dtypes (fp8): the problems they make take scales, and only some patterns take them
SCALED_DTYPES: tuple[str, ...] = tuple(name for name, d in DTYPES.items() if d.scaled)


def lookup(name: object) -> DType | None:
    """The record of a dtype spelled ``name`` (any alias, ``torch.`` prefix allowed), or None."""
    key = str(name).lower().removeprefix("torch.")
    return DTYPES.get(_ALIASES.get(key, key))


def dtype_of(name: str) -> DType:
    """The record of a canonical dtype name (KeyError for an unknown one)."""
    return DTYPES[name]
