import pytest

from ficco.problem import Problem
from ficco.space import (
    RELAYS,
    RULES,
    Gemm,
    Granularity,
    Schedule,
    Split,
    Transport,
    check_legal,
    enumerate_schedules,
    is_legal,
    violations,
)

AG = Problem(pattern="ag_gemm", m=8192, n=8192, k=8192, world=2)


def problems():
    yield AG
    yield Problem(pattern="gemm_rs", m=96, n=80, k=72, world=4)
    yield Problem(pattern="gemm_ar", m=96, n=80, k=72, world=3)
    yield Problem(pattern="gemm_ar", m=1, n=64, k=72, world=2)  # decode: only column chunks
    yield Problem(pattern="a2a_gemm", m=96, n=80, k=72, world=3, experts=6)
    yield Problem(
        pattern="gemm_a2a", m=64, n=32, k=32, world=2, experts=2, routing=((30, 2), (16, 16))
    )


@pytest.mark.parametrize("problem", list(problems()), ids=lambda p: p.key)
def test_enumeration_is_legal_unique_parseable_and_has_serial(problem):
    found = list(enumerate_schedules(problem))
    assert len(found) == len(set(found)) >= 12
    assert found[0].granularity is Granularity.SERIAL
    for s in found:
        assert Schedule.parse(str(s)) == s
        assert violations(problem, s) == []


def test_enumeration_covers_every_axis_value_that_applies():
    found = list(enumerate_schedules(AG))
    # symm1 / symm2 / lamport1 / lamport2 are all-reduce kernels: gemm_ar's alone; seg
    # batches all-to-all steps; sm moves the relay hops of ag_gemm and gemm_rs
    symm = {Transport.SYMM1, Transport.SYMM2, Transport.LAMPORT1, Transport.LAMPORT2}
    seg, sm = {Transport.SEG}, {Transport.SM}
    assert {s.transport for s in found} == set(Transport) - symm - seg
    ar = Problem(pattern="gemm_ar", m=96, n=80, k=72, world=2)
    assert {s.transport for s in enumerate_schedules(ar)} == set(Transport) - seg - sm
    for pattern in ("a2a_gemm", "gemm_a2a"):
        a2a = Problem(pattern=pattern, m=96, n=80, k=72, world=2, experts=4)
        assert {s.transport for s in enumerate_schedules(a2a)} == set(Transport) - symm - sm
    assert {s.split for s in found} == {Split.M, Split.K}  # N cannot cut an all-gather
    assert {s.chunks for s in found} == {1, 2, 4, 8, 16}
    assert {s.gemm for s in found} == set(Gemm)
    assert {s.sm_reserve for s in found} == {0, 16, 32}
    w3 = Problem(pattern="ag_gemm", m=96, n=80, k=72, world=3)
    assert any(s.order.value == "all_peers" for s in enumerate_schedules(w3))


def test_every_rule_excludes_something_named():
    names = {rule.__name__ for rule in RULES}
    hits = set()
    problem = Problem(pattern="gemm_rs", m=8, n=16, k=16, world=2)
    for text in [
        "finer-c16-m/nccl/cublas",  # 16 chunks of 4 rows
        "finer-c2-k/nccl/cublas",  # k cannot cut a reduce-scatter
        "finer-c2-n/ce/cublas",  # strided chunks on the copy engine
        "serial/nccl_ce/cublas",  # no reductions on copy engines
        "shard/nccl/cublas+all_peers",  # one peer only
        "shard/nccl/cublas+merged",
        "shard/nccl/cublas+sm16",
        "shard/ce/triton+sm16",
        "serial/nccl/cublas+hi",
        "shard/nccl/triton+sm500",  # more SMs than the GPU has
        "shard/ce/cublas+fused",  # cuBLAS cannot wait on flags
        "serial/ce/triton+fused",  # nothing to wait on
        "finer-c2-n/nccl/triton+fused",  # not a row cut, not on symmetric memory
        "shard/nccl/cublas+relay",  # two-sided hops
        "serial/ce/cublas+relay",  # nothing to relay step by step
        "finer-c2-m/ce/cublas+merged+relay",  # one GEMM over many hops
        "shard/ce/cublas+birelay",  # one chunk cannot go both ways
        "shard/ce/cublas+epilogue",  # nothing received to accumulate onto
        "shard/sm/cublas",  # sm moves relay hops only
    ]:
        hits |= {name for name, _ in violations(problem, Schedule.parse(text))}
    hits |= {name for name, _ in violations(problem, Schedule(granularity="finer", chunks=1))}
    hits |= {name for name, _ in violations(problem, Schedule.parse("shard/ce/cublas+rs_ag"))}
    gemm_ar = Problem(pattern="gemm_ar", m=10, n=16, k=16, world=3)
    for text in [
        "finer-c2-m/ce/cublas+rs_ag",  # 10 rows do not cut into 3 shards
        "shard/nccl/cublas",  # a direct all-reduce has no shards
        "finer-c2-m/nccl/cublas+all_peers",
        "finer-c2-m/nccl/cublas+merged",
        "finer-c2-n/symm1/cublas",  # the kernels reduce contiguous ranges
        "finer-c2-m/symm2/cublas+rs_ag",  # a kernel is a whole all-reduce
    ]:
        hits |= {name for name, _ in violations(gemm_ar, Schedule.parse(text))}
    hits |= {name for name, _ in violations(problem, Schedule.parse("serial/symm1/cublas"))}
    a2a = Problem(pattern="a2a_gemm", m=16, n=16, k=16, world=2, experts=2)
    hits |= {name for name, _ in violations(a2a, Schedule.parse("shard/ce/triton+fused"))}
    hits |= {name for name, _ in violations(a2a, Schedule.parse("shard/ce/cublas+relay"))}
    fp8 = Problem(pattern="ag_gemm", m=16, n=16, k=16, world=2, dtype="fp8_e4m3")
    hits |= {name for name, _ in violations(fp8, Schedule.parse("shard/ce/cublas+relay"))}
    fp16 = Problem(pattern="gemm_ar", m=10, n=16, k=16, world=3, dtype="fp16")
    hits |= {name for name, _ in violations(fp16, Schedule.parse("serial/symm2/cublas"))}
    odd = Problem(pattern="gemm_ar", m=10, n=15, k=16, world=3)  # bf16 rows of 30 bytes
    hits |= {name for name, _ in violations(odd, Schedule.parse("finer-c2-m/symm1/cublas"))}
    hits |= {name for name, _ in violations(problem, Schedule.parse("shard/seg/cublas"))}
    # fp32 rows of 70 elements are 280 bytes: not whole 16-byte vectors
    a2a = Problem(pattern="a2a_gemm", m=96, n=80, k=70, world=2, experts=4)
    hits |= {name for name, _ in violations(a2a, Schedule.parse("shard/seg/cublas"))}
    even = Problem(pattern="gemm_ar", m=6, n=16, k=16, world=3)
    hits |= {name for name, _ in violations(even, Schedule.parse("serial/nccl/cublas+rs_ag"))}
    fp8 = Problem(pattern="ag_gemm", m=8, n=32, k=48, world=2, dtype="fp8_e4m3")
    hits |= {name for name, _ in violations(fp8, Schedule.parse("finer-c2-k/nccl/cublas"))}
    assert hits == names


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("serial/nccl", "GRANULARITY/TRANSPORT/GEMM"),
        ("finer-4-m/ce/cublas", "granularity part"),
        ("shard/ib/cublas", "transport: unknown value 'ib'"),
        ("shard/ce/cutlass", "gemm: unknown value"),
        ("shard/ce/cublas+fast", "unknown option 'fast'"),
        ("shard/ce/cublas+hi+merged", "canonical form"),
        ("finer-c0-m/ce/cublas", "chunks: must be >= 1"),
    ],
)
def test_parse_errors_say_what_is_wrong(text, needle):
    with pytest.raises(ValueError, match="schedule") as err:
        Schedule.parse(text)
    assert needle in str(err.value)


def test_check_legal_names_the_rule():
    with pytest.raises(ValueError, match="transport_needs_contiguous_chunks"):
        check_legal(AG, Schedule.parse("finer-c2-k/ce/cublas"))


def test_string_form_examples():
    s = Schedule(
        granularity="finer",
        chunks=8,
        split="k",
        transport="nccl",
        gemm="triton",
        compute="merged",
        order="all_peers",
        sm_reserve=16,
        comm_priority="high",
    )
    assert str(s) == "finer-c8-k/nccl/triton+merged+all_peers+sm16+hi"
    assert str(Schedule()) == "serial/nccl/cublas"


def test_an_sm_reserve_beyond_the_gpu_is_illegal_not_clamped():
    from ficco.defaults import SM_COUNT

    problem = Problem(pattern="gemm_rs", m=96, n=80, k=72, world=2)
    most = Schedule.parse(f"finer-c2-m/nccl/triton+sm{SM_COUNT - 1}")
    assert is_legal(problem, most)
    for reserve in (SM_COUNT, 99999):
        schedule = Schedule.parse(f"finer-c2-m/nccl/triton+sm{reserve}")
        assert schedule.sm_reserve == reserve  # parsed as written
        broken = dict(violations(problem, schedule))
        assert f"have {SM_COUNT} SMs" in broken["sm_reserve_leaves_sms"]


@pytest.mark.parametrize("text", ["finer-c\u0664-m/ce/cublas", "shard/nccl/triton+sm\u0661\u0666"])
def test_parse_reads_ascii_digits_only(text):
    with pytest.raises(ValueError, match="schedule"):
        Schedule.parse(text)


def test_parse_takes_only_strings():
    with pytest.raises(ValueError, match="expected a string"):
        Schedule.parse(4)


def test_gemm_ar_space():
    """Serial, chunked direct all-reduces over M or N, and gemm_rs's overlapped schedules
    with an all-gather (+rs_ag) only where W divides M."""
    p = Problem(pattern="gemm_ar", m=96, n=80, k=72, world=3)
    found = list(enumerate_schedules(p))
    assert {s.split for s in found} == {Split.M, Split.N}
    serial = [str(s) for s in found if s.granularity is Granularity.SERIAL]
    assert serial == [
        "serial/ce/triton",
        "serial/ce/cublas",
        "serial/nccl/triton",
        "serial/nccl/cublas",
        "serial/symm1/triton",
        "serial/symm1/cublas",
        "serial/symm2/triton",
        "serial/symm2/cublas",
        "serial/lamport1/triton",
        "serial/lamport1/cublas",
        "serial/lamport2/triton",
        "serial/lamport2/cublas",
    ]
    direct = [s for s in found if s.all_reduce.value == "direct"]
    assert all(s.granularity is not Granularity.SHARD for s in direct)
    assert all(s.order.value == "ring" and s.compute.value != "merged" for s in direct)
    # the producer's fused one-shot all-reduce: finer row chunks on ce (tests/test_fused_allreduce)
    assert {s.compute.value for s in direct} == {"per_chunk", "fused"}
    rs_ag = {str(s) for s in found if s.all_reduce.value == "rs_ag"}
    rs = Problem(pattern="gemm_rs", m=96, n=80, k=72, world=3)
    # fused ones included; relay orders are gemm_rs's own (gemm_ar has no relay lowering)
    overlapped = [s for s in enumerate_schedules(rs) if s.overlapped and s.order not in RELAYS]
    assert rs_ag == {f"{s}+rs_ag" for s in overlapped}
    ragged = Problem(pattern="gemm_ar", m=95, n=80, k=72, world=3)
    assert not any(s.all_reduce.value == "rs_ag" for s in enumerate_schedules(ragged))
    decode = Problem(pattern="gemm_ar", m=1, n=64, k=72, world=2)
    chunked = [s for s in enumerate_schedules(decode) if s.overlapped]
    assert chunked and all(s.split is Split.N for s in chunked)


def test_rs_ag_string_form_round_trips():
    s = Schedule.parse("finer-c4-m/nccl/triton+merged+sm16+hi+rs_ag")
    assert s.all_reduce.value == "rs_ag" and str(s) == "finer-c4-m/nccl/triton+merged+sm16+hi+rs_ag"
    with pytest.raises(ValueError, match="rs_ag_needs_all_reduce"):
        check_legal(AG, Schedule.parse("shard/ce/cublas+rs_ag"))


def _every_point(problem, opts):
    """The whole axis product, each point checked against every rule (the enumerator
    before it pruned by PREFIX_RULES)."""
    import itertools

    from ficco.patterns import spec_of
    from ficco.space import AllReduce, Order, Priority

    shapes = [(Granularity.SERIAL, 1), (Granularity.SHARD, 1)]
    shapes += [(Granularity.FINER, c) for c in opts.chunk_counts]
    reduces = tuple(AllReduce) if spec_of(problem.pattern).all_reduce else (AllReduce.DIRECT,)
    found = []
    for (g, c), split, t, order, compute, gemm, res, prio, ar in itertools.product(
        shapes, Split, opts.transports, Order, opts.computes, opts.gemms, opts.sm_reserves,
        Priority, reduces,
    ):  # fmt: skip
        s = Schedule(
            granularity=g, chunks=c, split=split, transport=t, order=order, compute=compute,
            gemm=gemm, sm_reserve=res, comm_priority=prio, all_reduce=ar,
        )  # fmt: skip
        if s not in found and is_legal(problem, s):
            found.append(s)
    return found


@pytest.mark.parametrize(
    "problem",
    [*problems(), Problem(pattern="emb_a2a", m=64, n=32, k=8, world=2, tables=(400, 90, 1000)),
     Problem(pattern="ag_gemm", m=128, n=64, k=64, world=2, dtype="fp8_e4m3")],
    ids=lambda p: p.key,
)  # fmt: skip
def test_prefix_pruning_enumerates_exactly_the_legal_points_of_the_product(problem):
    # PREFIX_RULES are checked once per (granularity, chunks, split, transport): a rule there
    # that read another axis would drop legal schedules; this compares with every point
    from ficco.space import SpaceOptions
    from ficco.space.rules import PREFIX_RULES

    assert set(PREFIX_RULES) <= set(RULES)
    opts = SpaceOptions()
    assert list(enumerate_schedules(problem, opts)) == _every_point(problem, opts)


def test_a_rule_is_registered_once_where_it_is_defined(monkeypatch):
    # RULES, PREFIX_RULES and point_legal's order come from the decorator: a rule defined
    # with @rule(...) is in every list its kind belongs to, and a second of its name is refused
    import ficco.space.rules as rules

    monkeypatch.setattr(rules, "_REGISTERED", dict(rules._REGISTERED))
    assert list(rules._REGISTERED) == list(RULES)
    assert set(rules.PREFIX_RULES) | set(rules._POINT_RULES) == set(RULES)
    assert not set(rules.PREFIX_RULES) & set(rules._POINT_RULES)

    def priority_needs_overlap(p, s):
        return None

    with pytest.raises(ValueError, match="rule: priority_needs_overlap is registered twice"):
        rules.rule(rules.Reads.AXES)(priority_needs_overlap)
