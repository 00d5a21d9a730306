"""Scaled (fp8) dtypes without ranks: the registry and its twins, problems and their sizes,
the rules, quantization and the FP8 GEMM, the refusals (scales, GPUs, torch), recommend and
workloads."""

import json

import pytest
import torch
from click.testing import CliRunner

import ficco
import ficco.api as api
from ficco.cli import main
from ficco.dtypes import DTYPES, SCALED_DTYPES
from ficco.execute.scaled import allocate_scaled, operand_sides, quantize, scale_name
from ficco.execute.scaled_baselines import async_tp_scaled_op, scaled_cuda_baselines
from ficco.execute.verify import check_output
from ficco.export import lookup, lookup_features
from ficco.kernels import scaled_mm
from ficco.patterns import Collective, spec_of
from ficco.plan import build_plan
from ficco.problem import DTYPE_BYTES, Problem, canonical_dtype, torch_dtype
from ficco.space import Schedule, enumerate_schedules, violations
from ficco.space.geometry import geometry
from ficco.validate import InputError
from ficco.verdict import Unavailable

ROUTED = {"a2a_gemm", "gemm_a2a"}


def fp8(pattern="ag_gemm", m=32, n=32, k=48, world=2, **kw) -> Problem:
    if pattern in ROUTED:
        kw.setdefault("experts", 2 * world)
    kw.setdefault("dtype", "fp8_e4m3")
    return Problem(pattern=pattern, m=m, n=n, k=k, world=world, **kw)


def plain(problem: Problem, dtype="bf16") -> Problem:
    kw = {}
    if problem.pattern.is_all_to_all:
        kw = {"experts": problem.experts, "routing": problem.routing, "top_k": problem.top_k}
    return Problem(
        pattern=problem.pattern, m=problem.m, n=problem.n, k=problem.k, world=problem.world,
        dtype=dtype, **kw,
    )  # fmt: skip


# --- the registry and its twins -----------------------------------------------------------


def test_the_lookup_twin_knows_every_dtype_width_alias_and_output():
    assert lookup_features.DTYPE_BYTES == DTYPE_BYTES == {n: d.bytes for n, d in DTYPES.items()}
    for d in DTYPES.values():
        for spelling in (d.name, *d.aliases, f"torch.{d.torch_name}"):
            assert lookup_features.canonical_dtype(spelling) == canonical_dtype(spelling) == d.name
        assert torch_dtype(d.name) is getattr(torch, d.torch_name)


def test_every_scaled_dtype_writes_a_plain_one():
    assert set(SCALED_DTYPES) == {"fp8_e4m3", "fp8_e5m2"}
    for name in SCALED_DTYPES:
        out = DTYPES[DTYPES[name].output_name]
        assert not out.scaled and DTYPES[name].largest > 0


# --- problems -----------------------------------------------------------------------------


def test_an_fp8_problem_names_its_scales_in_its_key_and_round_trips():
    p = fp8(a_scale="row", b_scale="column")
    assert p.key == "ag_gemm:m32:n32:k48:w2:fp8_e4m3:sa-row:sb-column"
    assert Problem.from_dict(json.loads(str(p))) == p
    assert fp8().key.endswith(":fp8_e4m3:sa-tensor:sb-tensor")  # per tensor unless told
    assert "a_scale" not in plain(p).to_dict() and plain(p).key.endswith(":bf16")


@pytest.mark.parametrize(
    ("kw", "field", "rule"),
    [
        ({"dtype": "bf16", "a_scale": "row"}, "a_scale", "only scaled dtypes take it"),
        ({"a_scale": "column"}, "a_scale", "must be one of tensor, row"),
        ({"b_scale": "row"}, "b_scale", "must be one of tensor, column"),
        ({"k": 40}, "k", "multiple of 16"),
        ({"n": 24}, "n", "multiple of 16"),
    ],
)
def test_a_wrong_fp8_problem_is_refused_naming_the_field(kw, field, rule):
    with pytest.raises(InputError, match=rule) as err:
        fp8(**kw)
    assert err.value.field == field


# --- sizes: what moves is fp8 (with row scales) where A moves, bf16 where C moves -----------


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs", "gemm_ar", "a2a_gemm", "gemm_a2a"])
def test_bytes_moved_follow_what_the_collective_moves(pattern):
    tensor, row, bf16 = fp8(pattern), fp8(pattern, a_scale="row"), plain(fp8(pattern))
    spec = spec_of(pattern)
    if spec.moved_dim == "k":  # A's rows: 1-byte elements, and a 4-byte scale per row
        assert 2 * tensor.comm_bytes_per_rank() == bf16.comm_bytes_per_rank()
        rows = tensor.comm_bytes_per_rank() // tensor.k
        assert row.comm_bytes_per_rank() == rows * (tensor.k + 4)
    else:  # the product's rows: bf16 partials whatever the inputs
        assert tensor.comm_bytes_per_rank() == row.comm_bytes_per_rank()
        assert tensor.comm_bytes_per_rank() == bf16.comm_bytes_per_rank()
    assert spec.sizes(tensor).weights == spec.sizes(bf16).weights


def test_a_chunk_of_rows_of_a_carries_its_scales():
    p = fp8(a_scale="row")
    g = geometry(p, Schedule.parse("finer-c2-m/ce/cublas"))
    assert g.transfer_bytes == g.transfer_rows * (p.k + 4)


# --- rules --------------------------------------------------------------------------------


def test_fp8_schedules_take_both_gemms_with_aligned_chunks():
    p = fp8(k=48)
    found = list(enumerate_schedules(p))
    assert found and Schedule() in found
    # ficco's Triton FP8 GEMM (ficco.kernels.scaled) and the fused kernel take fp8 too
    assert {s.gemm.value for s in found} == {"cublas", "triton"}
    assert any(s.compute.value == "fused" for s in found)
    assert not violations(p, Schedule.parse("shard/ce/triton"))
    # k cut in two chunks of 24: not multiples of 16
    names = {n for n, _ in violations(p, Schedule.parse("finer-c2-k/nccl/cublas"))}
    assert names == {"scaled_gemm_chunks_aligned"}
    assert not violations(fp8(k=64), Schedule.parse("finer-c2-k/nccl/cublas"))


def test_the_symmetric_memory_all_reduce_takes_fp8_gemm_ar_for_it_moves_bf16():
    # symm1/symm2 run fp32 and bf16 only: an fp8 gemm_ar reduces bf16 partials
    for text in ("serial/symm1/cublas", "serial/symm2/cublas"):
        assert not violations(fp8("gemm_ar"), Schedule.parse(text))
        assert violations(plain(fp8("gemm_ar"), "fp16"), Schedule.parse(text))


# --- quantization, the FP8 GEMM and verification -------------------------------------------


@pytest.mark.parametrize("dtype", SCALED_DTYPES)
def test_quantized_inputs_are_fp8_bits_and_positive_scales(dtype):
    p = fp8(dtype=dtype, a_scale="row", b_scale="column")
    values = torch.randn(8, 32)
    bits, scales = quantize(p, "a", values)
    assert bits.dtype is torch_dtype(dtype) and scales.shape == (8, 1) and (scales > 0).all()
    back = bits.float() * scales
    assert (back - values).abs().max() <= 0.13 * values.abs().max()  # 3 or 2 mantissa bits
    bits, scales = quantize(p, "b", values)
    assert scales.shape == (1, 32)


@pytest.mark.parametrize("a_scale", ["tensor", "row"])
@pytest.mark.parametrize("b_scale", ["tensor", "column"])
def test_the_emulated_gemm_is_torchs_scaled_mm_on_the_same_bits(a_scale, b_scale):
    p = fp8(a_scale=a_scale, b_scale=b_scale)
    a, sa = quantize(p, "a", torch.randn(16, 48))
    b, sb = quantize(p, "b", torch.randn(48, 32))
    ours = scaled_mm.scaled_matmul(a, b, sa, sb)
    assert ours.dtype is torch.bfloat16
    if a_scale == "tensor" and b_scale == "tensor":
        # torch's CPU kernel (tensor-wise scales), same bits: the same bf16 result
        theirs = torch._scaled_mm(
            a, b.t().contiguous().t(), scale_a=sa.reshape(()), scale_b=sb.reshape(()),
            out_dtype=torch.bfloat16,
        )  # fmt: skip
        assert torch.allclose(ours.float(), theirs.float(), rtol=2**-7, atol=0)
    exact = (a.double() * sa.double()) @ (b.double() * sb.double())
    assert (ours.double() - exact).abs().max() <= 2**-7 * exact.abs().max()


def _ag_gemm_output(p: Problem, seed: int, drop_scales: bool) -> torch.Tensor:
    """Rank 0's ag_gemm output from every rank's quantized shard, on the emulated GEMM."""
    ranks = [allocate_scaled(build_plan(p, Schedule(), r), seed) for r in range(p.world)]
    a = torch.cat([t["a_shard"] for t in ranks])
    sa = torch.cat([t[scale_name("a_shard")] for t in ranks])
    b, sb = ranks[0]["b"], ranks[0][scale_name("b")]
    if drop_scales:
        sa = torch.ones_like(sa)
    return scaled_mm.scaled_matmul(a, b, sa, sb)


def test_verification_catches_rows_that_arrive_without_their_scales():
    from ficco.execute.reference import reference_output

    p = fp8(a_scale="row", b_scale="column")
    exact, plain_out = reference_output(p, 0, seed=3)
    assert plain_out.dtype is torch.bfloat16
    good = check_output(_ag_gemm_output(p, 3, False), exact, plain_out, p, Schedule())
    bad = check_output(_ag_gemm_output(p, 3, True), exact, plain_out, p, Schedule())
    assert good.ok and not bad.ok and bad.max_abs_err > 10 * bad.tolerance


def test_a_one_row_shard_still_has_a_row_scale_to_move():
    from ficco.execute.scaled import row_scales
    from ficco.plan import Region

    p = fp8(m=2, a_scale="row")  # a_shard [1, 48]: its scale [1, 1] is the row's
    t = allocate_scaled(build_plan(p, Schedule(), 0), 0)
    assert row_scales(p, t, Region("a_shard", (0, 1), (0, 48))).shape == (1, 1)
    assert row_scales(p, t, Region("b", (0, 48), (0, 32))) is None
    per_tensor = fp8(m=2)
    t = allocate_scaled(build_plan(per_tensor, Schedule(), 0), 0)
    assert row_scales(per_tensor, t, Region("a_shard", (0, 1), (0, 48))) is None


def test_buffers_take_their_sides_dtype():
    p = fp8("gemm_rs", a_scale="row")
    plan = build_plan(p, Schedule(), 0)
    a_side, b_side = operand_sides(plan)
    assert (a_side, b_side) == ({"a"}, {"b"})
    t = allocate_scaled(plan, 0)
    assert t["a"].dtype is torch.float8_e4m3fn and t[scale_name("a")].shape == (p.m, 1)
    assert t["partial"].dtype is t["c_shard"].dtype is torch.bfloat16  # partials in bf16
    assert t["partial"].isnan().all()  # poisoned
    ag = allocate_scaled(build_plan(fp8(a_scale="row"), Schedule(), 0), 0)
    assert ag["a_full"].float().isnan().all() and ag[scale_name("a_full")].isnan().all()


# --- refusals: a wrong scale, a GPU without FP8, a torch without _scaled_mm -----------------


def _operands():
    p = fp8()
    a, sa = quantize(p, "a", torch.randn(4, 16))
    b, sb = quantize(p, "b", torch.randn(16, 8))
    return a, b, sa, sb


@pytest.mark.parametrize(
    ("which", "scale", "rule"),
    [
        ("a_scale", torch.ones(4, 1, dtype=torch.float16), "float32"),
        ("a_scale", torch.ones(2, 1), r"\[4, 1\] \(one per row\)"),
        ("b_scale", torch.ones(8, 1), r"\[1, 8\] \(one per column\)"),
        ("a_scale", torch.zeros(1), "finite and positive"),
        ("b_scale", torch.full((1, 8), -1.0), "finite and positive"),
        ("b_scale", torch.tensor(float("nan")), "finite and positive"),
    ],
)
def test_a_wrong_scale_is_refused_naming_it(which, scale, rule):
    a, b, sa, sb = _operands()
    args = {"a_scale": sa, "b_scale": sb, which: scale}
    with pytest.raises(InputError, match=rule) as err:
        scaled_mm.scaled_matmul(a, b, args["a_scale"], args["b_scale"])
    assert err.value.field == which


def test_a_gpu_below_compute_capability_8_9_is_refused(monkeypatch):
    monkeypatch.setattr(scaled_mm, "device_capability", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    reason = scaled_mm.gpu_refusal("fp8_e4m3", "cuda")
    assert "compute capability 8.9" in reason and "NVIDIA A100 has 8.0" in reason
    monkeypatch.setattr(scaled_mm, "device_capability", lambda device: (9, 0))
    assert scaled_mm.gpu_refusal("fp8_e4m3", "cuda") is None


def test_a_torch_without_scaled_mm_is_refused(monkeypatch):
    monkeypatch.setattr(scaled_mm, "torch_scaled_mm", lambda: None)
    assert "has no torch._scaled_mm" in scaled_mm.gpu_refusal("fp8_e5m2", "cuda")


def _raises_unavailable(baselines: dict, needle: str) -> None:
    assert baselines
    for fn in baselines.values():
        with pytest.raises(Unavailable, match=needle):
            fn()


def test_the_gpu_baselines_are_refused_with_their_cause_off_gpus(monkeypatch):
    p = fp8()
    _raises_unavailable(scaled_cuda_baselines(p, {}, "cpu", "g"), "run on GPUs only")
    monkeypatch.setattr(scaled_mm, "device_capability", lambda device: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "RTX 3090")
    _raises_unavailable(scaled_cuda_baselines(p, {}, "cuda", "g"), "RTX 3090 has 8.6")
    monkeypatch.setattr(scaled_mm, "torch_scaled_mm", lambda: None)
    _raises_unavailable(scaled_cuda_baselines(p, {}, "cuda", "g"), "no torch._scaled_mm")


def test_async_tp_has_scaled_ops_for_the_gather_and_the_scatter_only():
    assert async_tp_scaled_op(Collective.ALL_TO_ALL) is None
    assert async_tp_scaled_op(Collective.ALL_REDUCE) is None


def test_the_cuda_backends_take_fp8_plans_fused_ones_where_they_take_any():
    from ficco.backends import backend_spec

    fused = Schedule.parse("finer-c2-m/ce/triton+fused")
    for name in ("cuda", "cuda_shared"):
        assert backend_spec(name).check(fp8(), Schedule()) is None
        assert backend_spec(name).check(fp8(), Schedule.parse("finer-c2-m/ce/cublas")) is None
        assert backend_spec(name).check(fp8(), Schedule.parse("finer-c2-m/ce/triton")) is None
    # the fused kernel takes fp8 (its scale epilogue): fp8 and plain alike on real GPUs,
    # refused alike where ranks share one (a flag-waiting kernel needs distinct GPUs)
    assert backend_spec("cuda").check(fp8(), fused) is None
    assert backend_spec("cuda").check(plain(fp8()), fused) is None
    shared = backend_spec("cuda_shared").check(fp8(), fused)
    assert shared and shared == backend_spec("cuda_shared").check(plain(fp8()), fused)
    # cuBLASLt has no e5m2 x e5m2 GEMM: every schedule of an fp8_e5m2 problem, naming why
    e5m2 = backend_spec("cuda").check(fp8(dtype="fp8_e5m2"), Schedule())
    assert e5m2 and "e5m2 x fp8_e5m2" in e5m2 and "--backend cpu" in e5m2


# --- recommend, workloads -----------------------------------------------------------------


def test_recommend_refuses_fp8_until_a_measured_store_exists():
    with pytest.raises(InputError, match="no measured table answers fp8_e4m3") as err:
        ficco.recommend(fp8())
    assert err.value.field == "dtype"
    out = CliRunner().invoke(
        main, ["recommend", "ag_gemm", "--m", "32", "--n", "32", "--k", "48", "-w", "2",
               "--dtype", "fp8_e4m3", "--a-scale", "row"],
    )  # fmt: skip
    assert out.exit_code != 0 and "no measured table answers fp8_e4m3" in out.output


def test_the_selector_has_no_fp8_features_until_measured():
    from ficco.select.features import raw_features, roofs_for

    with pytest.raises(ValueError, match="dtype: .* fp8_e4m3 has no measured profiles"):
        raw_features(fp8(), roofs_for("h200x2"))


def test_the_lookup_places_fp8_outside_every_table_range():
    from ficco.shipped import shipped_dir

    table = lookup.load_table(shipped_dir("schedules") / "h200x2" / "table.json")
    answer = table.lookup("ag_gemm", 8192, 8192, 8192, 2, dtype="float8_e4m3fn")
    assert not answer.in_range and answer.features == ()


def test_workloads_gives_the_catalogs_fp8_problems():
    out = CliRunner().invoke(main, ["workloads", "--dtype", "fp8_e4m3", "--json"])
    assert out.exit_code == 0, out.output
    problems = [Problem.from_dict(_problem_fields(d)) for d in json.loads(out.output)["problems"]]
    assert problems and {p.dtype for p in problems} == {"fp8_e4m3"}
    bf16 = json.loads(CliRunner().invoke(main, ["workloads", "--json"]).output)["problems"]
    same = [Problem.from_dict(_problem_fields(d)) for d in bf16]
    assert [plain(p).key for p in problems] == [p.key for p in same]  # every layer, as bf16's


def _problem_fields(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k not in ("key", "same_shape_as")}


def test_the_cli_spells_an_fp8_problem_with_its_scales():
    args = ["enumerate", "ag_gemm", "--m", "32", "--n", "32", "--k", "48", "-w", "2"]
    out = CliRunner().invoke(main, [*args, "--dtype", "fp8_e4m3", "--a-scale", "row", "--json"])
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output)
    assert payload["problem"]["a_scale"] == "row" and payload["problem"]["b_scale"] == "tensor"
    gemms = {s.split("/")[2].split("+")[0] for s in payload["schedules"]}
    assert gemms == {"cublas", "triton"}
    out = CliRunner().invoke(main, [*args, "--a-scale", "row"])  # bf16 takes no scales
    assert out.exit_code == 2 and "only scaled dtypes take it" in out.output


def test_make_problem_passes_the_scales():
    p = api.make_problem("ag_gemm", m=32, n=32, k=48, world=2, dtype="fp8_e5m2", a_scale="row")
    assert (p.a_scale, p.b_scale) == ("row", "tensor")


def test_a_cpu_rank_of_an_fp8_problem_counts_bf16_outputs_and_float64_references():
    from ficco.api.checks import rank_bytes

    p = fp8()  # a_shard [16, 48], b [48, 32], a_full [32, 48], c [32, 32]
    buffers = 16 * 48 + 48 * 32 + 32 * 48 + 32 * 32  # fp8: 1 byte each (a lower bound)
    output = 32 * 32 * (8 + 2)  # float64 exact, bf16 plain
    inputs = 2 * (16 * 48 + 48 * 32) * (1 + 8)  # every rank's bits and dequantized values
    assert rank_bytes(p, 0, "cpu") == buffers + output + inputs


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs"])
def test_the_cost_models_byte_counts_follow_what_moves(pattern):
    """The model's lowering prices fp8 A rows with their row scales and bf16 partials, as the
    geometry counts them."""
    from ficco.model import SHIPPED_PARAMS, load_machine, load_params
    from ficco.model.costs import CostModel

    costs = CostModel(load_machine("h200x2"), load_params(SHIPPED_PARAMS))
    s = Schedule.parse("shard/ce/cublas")
    per_ms = costs.machine.links["nvlink"].bytes_per_ms  # a term is bytes over the link
    moved = {}
    scaled = fp8(pattern, m=4096, n=4096, k=4096, a_scale="row")
    bf16 = plain(scaled)
    for p in (scaled, bf16):
        tasks = costs.lower(build_plan(p, s, 0), s)
        ce = [round(ms * per_ms) for t in tasks for cls, _, ms in t.terms if cls.startswith("ce")]
        moved[p.dtype] = ce
    assert geometry(bf16, s).transfer_bytes in moved["bf16"]
    want = geometry(scaled, s).transfer_bytes
    assert want in moved["fp8_e4m3"]
    if pattern == "ag_gemm":  # 1-byte elements and a 4-byte scale per row
        assert want == 2048 * (4096 + 4) < geometry(bf16, s).transfer_bytes
    else:  # bf16 partials
        assert want == geometry(bf16, s).transfer_bytes


@pytest.mark.parametrize("pattern", ["ag_gemm", "gemm_rs", "gemm_ar", "a2a_gemm", "gemm_a2a"])
def test_b_is_held_column_major_as_fp8_tensor_cores_read_it(pattern):
    """Every pattern's B (per expert too): [..., N, K] row-major viewed [..., K, N], so the
    Gluon kernels and cuBLASLt take it without a copy; its values the seeded ones."""
    from ficco.execute.scaled import seeded_input

    p = fp8(pattern, a_scale="row", b_scale="column")
    plan = build_plan(p, Schedule(), 0)
    _, b_side = operand_sides(plan)
    t = allocate_scaled(plan, 0)
    for name in b_side:
        b = t[name]
        assert b.stride(-2) == 1 and b.stride(-1) == b.shape[-2], (name, b.stride())
        bits, _ = seeded_input(p, 0, name, "b", tuple(b.shape), 0)
        assert torch.equal(b.view(torch.uint8), bits.view(torch.uint8))
