"""Transports as data (``ficco.space.transports``): every value has a traits record, the
records agree with what each layer does with them, and one function says which schedules
run as CUDA graphs, for the executor and the cost model alike."""

from pathlib import Path

import pytest

from ficco.execute.allreduce import SYMM_KINDS
from ficco.execute.options import TimingOptions
from ficco.model import graphed
from ficco.model.predict import PREDICTED_SPACE
from ficco.patterns import spec_of
from ficco.patterns.spec import Collective
from ficco.plan.allreduce import all_reduce_source
from ficco.problem import Pattern, Problem
from ficco.space import (
    GRAPH_MODES,
    TRAITS,
    Granularity,
    Schedule,
    SpaceOptions,
    Transport,
    enumerate_schedules,
    runs_as_graph,
    traits,
)
from ficco.space.transports import COST_CLASSES, TransportTraits, transports_where

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "profiles" / "h200x2" / "store"


def test_every_transport_has_a_traits_record():
    missing = [t.value for t in Transport if t not in TRAITS]
    assert not missing, f"transports without a TransportTraits record in TRAITS: {missing}"
    assert set(TRAITS) == set(Transport)
    for t, record in TRAITS.items():
        assert record.transport is t
        assert t.traits is record is traits(t.value)


def test_an_unknown_transport_name_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="transport: unknown value 'dma'"):
        traits("dma")


def test_a_record_with_an_unknown_cost_class_is_refused():
    fields = {f: getattr(TRAITS[Transport.CE], f) for f in TransportTraits.__slots__}
    with pytest.raises(ValueError, match="cost_class: 'dma'"):
        TransportTraits(**{**fields, "cost_class": "dma"})
    with pytest.raises(ValueError, match="one-sided transport has no two-sided pairs"):
        TransportTraits(**{**fields, "batches_pairs": True})


def test_every_transport_that_moves_transfers_has_one_way_to_issue_them():
    # the executors issue a transfer one-sidedly (pull or push) or as a two-sided batch
    for t in Transport:
        r = t.traits
        if r.moves_transfers:
            assert r.one_sided != r.batches_pairs, t
        assert not r.batches_segments or r.one_sided, t  # segment groups are one-sided
        assert r.cost_class in COST_CLASSES
        # bytes move on copy engines or on SMs; a copy engine moves contiguous ranges only;
        # only SM-based communication takes an SM reserve
        assert r.copy_engine != r.on_sms, t
        assert not r.copy_engine or r.contiguous_only, t
        assert not r.sm_reserve or r.on_sms, t


def test_every_all_reduce_kind_is_run_by_both_backends_from_its_source():
    # the CPU and CUDA primitives run NCCL's "all_reduce" and the symmetric-memory kinds
    for t in Transport:
        kind = t.traits.all_reduce_kind
        assert kind is None or kind == "all_reduce" or kind in SYMM_KINDS, t
    # where a gemm_ar chunk's GEMM writes (what the plans lowered before the traits)
    source = {t: all_reduce_source(Schedule(transport=t)) for t in Transport}
    assert source == {
        Transport.CE: "partial",
        Transport.NCCL: "partial",
        Transport.NCCL_CE: "partial",
        Transport.SYMM1: "staging",
        Transport.SYMM2: "c",
        Transport.LAMPORT1: "partial",  # the kernels push from it into their own scratch
        Transport.LAMPORT2: "partial",
        Transport.SEG: "partial",
        Transport.SM: "partial",
    }


def test_the_answers_the_layers_used_to_list_by_hand():
    """What the rules, the plans and the executors listed before the traits existed (and
    sm, added after them: one-sided pushes on SMs, like seg's)."""
    T = Transport
    assert transports_where(lambda r: r.one_sided) == (T.CE, T.SEG, T.SM)
    assert transports_where(lambda r: r.sm_reserve) == (T.NCCL, T.SEG, T.SM)
    assert transports_where(lambda r: r.contiguous_only) == (
        T.CE, T.NCCL_CE, T.SYMM1, T.SYMM2, T.LAMPORT1, T.LAMPORT2
    )  # fmt: skip
    assert transports_where(lambda r: not r.reduces) == (T.NCCL_CE,)
    assert transports_where(lambda r: r.carries_flags) == (T.CE,)
    assert transports_where(lambda r: r.batches_segments) == (T.SEG,)
    assert transports_where(lambda r: not r.moves_transfers) == (
        T.SYMM1, T.SYMM2, T.LAMPORT1, T.LAMPORT2
    )  # fmt: skip
    assert transports_where(lambda r: r.cost_class == "nccl") == (T.NCCL,)
    assert transports_where(lambda r: r.communicator == "nccl_zero_cta") == (T.NCCL_CE,)
    assert transports_where(lambda r: r.needs_signals) == (T.CE, T.SEG, T.SM)
    assert transports_where(lambda r: r.symmetric_memory) == (
        T.CE,
        T.SYMM1,
        T.SYMM2,
        T.SEG,
        T.SM,
    )
    assert transports_where(lambda r: r.relay_only) == (T.SM,)


def test_predict_covers_the_calibrated_transports():
    assert PREDICTED_SPACE.transports == transports_where(lambda r: r.calibrated)
    assert PREDICTED_SPACE.transports == (Transport.CE, Transport.NCCL)


def _kw(pattern: Pattern) -> dict:
    """The fields a pattern's problem needs beyond its sizes (experts; emb_a2a's tables)."""
    if pattern.pools_tables:
        return {"tables": (1000, 20, 300, 64)}
    return {"experts": 4} if pattern.is_all_to_all else {}


@pytest.mark.parametrize("pattern", list(Pattern))
def test_the_space_offers_a_transport_exactly_for_the_patterns_it_serves(pattern):
    problem = Problem(pattern=pattern, m=128, n=128, k=128, world=2, dtype="bf16", **_kw(pattern))
    offered = {s.transport for s in enumerate_schedules(problem, SpaceOptions())}
    assert offered == {t for t in Transport if pattern in t.traits.patterns}


def _executor_rule_before(schedule: Schedule, graphs: str) -> bool:
    """``CudaBackend.wants_graph`` as it was written before the traits (by hand; sm, added
    after them, captures as ce does)."""
    t = schedule.transport
    if t is Transport.NCCL_CE:
        return False
    kernels = (Transport.SYMM1, Transport.SYMM2, Transport.LAMPORT1, Transport.LAMPORT2)
    if t in (Transport.CE, Transport.SEG, Transport.SM, *kernels):
        return graphs in ("all", "ce")
    return graphs == "all" and schedule.granularity is Granularity.SERIAL


def _model_rule_before(schedule: Schedule) -> bool:
    """``ficco.model.predict.graphed`` as it was before: no option, nccl_ce captured."""
    return not (schedule.overlapped and schedule.transport is Transport.NCCL)


@pytest.mark.parametrize("graphs", GRAPH_MODES)
@pytest.mark.parametrize("granularity", ["serial", "shard"])
@pytest.mark.parametrize("transport", list(Transport))
def test_runs_as_graph_is_what_the_executor_did(transport, granularity, graphs):
    schedule = Schedule(granularity=granularity, transport=transport)
    want = _executor_rule_before(schedule, graphs)
    assert runs_as_graph(schedule, graphs) is want
    from ficco.execute.cuda_backend import CudaBackend

    assert CudaBackend.wants_graph(None, TimingOptions(graphs=graphs), schedule) is want


def test_runs_as_graph_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="graphs: 'some'"):
        runs_as_graph(Schedule(), "some")


def test_the_model_asks_the_same_function_and_only_nccl_ce_and_all_to_all_nccl_flip():
    """The model's ``graphed`` is the executor's answer under the records' mode ('all'); it
    differs from what the model used to say for nccl_ce schedules (now eager, as the executor
    always ran them) and, of the all-to-all patterns, for the NCCL schedules the executor
    keeps out of graphs (``graph_refusal``)."""
    flipped = set()
    for pattern in Pattern:
        problem = Problem(
            pattern=pattern, m=128, n=128, k=128, world=4, dtype="bf16", **_kw(pattern)
        )
        all_to_all = spec_of(pattern).collective is Collective.ALL_TO_ALL
        for s in enumerate_schedules(problem, SpaceOptions(sm_reserves=(0,))):
            assert graphed(s, pattern) is runs_as_graph(s, "all", pattern)
            if graphed(s, pattern) is not _model_rule_before(s):
                flipped.add((all_to_all, s.transport))
    assert flipped == {
        (False, Transport.NCCL_CE),
        (True, Transport.NCCL_CE),
        (True, Transport.NCCL),
    }
    assert graphed(Schedule(transport=Transport.NCCL), graphs="ce") is False  # the mode holds


def test_the_shipped_store_records_were_captured_as_runs_as_graph_says():
    """Every schedule record of the shipped 2xH200 store (what the model is calibrated on and
    validated against) was captured exactly where ``graphed`` says, and the model's answer
    for each is what it was before: the shipped model and its figures do not change."""
    seen = 0
    transports = set()
    from ficco.profile import open_store

    for record in open_store(STORE).records():
        if record["kind"] != "schedule" or record["verdict"] != "ok":
            continue
        schedule = Schedule.parse(record["name"])
        assert graphed(schedule) is (record["extra"]["graph"] == "graph"), record["name"]
        assert graphed(schedule) is _model_rule_before(schedule), record["name"]
        transports.add(schedule.transport)
        seen += 1
    assert seen > 6000
    assert transports == {Transport.CE, Transport.NCCL}
