"""The closed vocabularies (``ficco.words.Word``): members everywhere, strings unchanged."""

import json

import pytest

from ficco.patterns import Collective, spec_of
from ficco.plan import build_plan
from ficco.plan.ops import PULL, PUSH, CollectiveOp, Direction, Initiator, TransferOp
from ficco.problem import Problem
from ficco.space import Schedule, Transport
from ficco.space.transports import Communicator, CostClass, traits


def test_a_word_prints_reads_and_serializes_as_its_value():
    assert repr(Direction.RECV) == repr("recv")
    assert str(Collective.ALL_GATHER) == "all_gather" and Collective.ALL_GATHER == "all_gather"
    assert json.dumps({"k": Initiator.SENDER}) == '{"k": "sender"}'
    assert Collective.ALL_REDUCE.label == "all-reduce"
    assert (PULL, PUSH) == (Initiator.RECEIVER, Initiator.SENDER)


def test_a_collective_op_holds_a_member_and_refuses_a_misspelt_kind():
    assert CollectiveOp("all_gather", "a", "b").kind is Collective.ALL_GATHER
    with pytest.raises(ValueError, match="kind: 'all-gather'; expected one of all_gather"):
        CollectiveOp("all-gather", "a", "b")


def test_plans_and_traits_hold_members():
    p = Problem(pattern="ag_gemm", m=32, n=16, k=16, world=2)
    plan = build_plan(p, Schedule(transport=Transport.NCCL, granularity="shard"), 0)
    transfers = [t.op for t in plan.tasks if isinstance(t.op, TransferOp)]
    assert transfers and all(
        type(op.direction) is Direction and type(op.initiator) is Initiator for op in transfers
    )
    serial = build_plan(p, Schedule(transport=Transport.NCCL), 0)
    kinds = [t.op.kind for t in serial.tasks if isinstance(t.op, CollectiveOp)]
    assert kinds == [spec_of("ag_gemm").collective] and kinds[0] is Collective.ALL_GATHER
    for transport in Transport:
        t = traits(transport)
        assert type(t.cost_class) is CostClass
        assert t.communicator is None or type(t.communicator) is Communicator
        assert t.all_reduce_kind is None or type(t.all_reduce_kind) is Collective
