"""No executor's primitives object shadows one of its own primitives with an attribute.

The interpreter calls primitives by name (``prims.signal(op, deps)``); an ``__init__`` that
stores ``self.signal = <the signal stream>`` replaces that method on the instance, and every
plan with the op then fails at run time with "'Stream' object is not callable" -- on GPUs
only, where the CUDA primitives run. Read from the classes' sources, so it runs on CPU.
"""

import ast
import inspect
import textwrap

import pytest

from ficco.execute.cpu import CpuPrimitives
from ficco.execute.cuda import CudaPrimitives
from ficco.execute.cuda_shared import SharedPrimitives


def _assigned_self_attributes(cls: type) -> set[str]:
    """Names assigned as ``self.NAME = ...`` anywhere in ``cls``'s own body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    names.add(t.attr)
    return names


@pytest.mark.parametrize("prims", [CpuPrimitives, CudaPrimitives, SharedPrimitives])
def test_no_attribute_shadows_a_method(prims):
    methods = {name for name, v in inspect.getmembers(prims) if inspect.isfunction(v)}
    assert "signal" in methods  # the check reads the names the interpreter calls
    for cls in prims.__mro__:
        if cls.__module__.startswith("ficco."):
            shadowed = _assigned_self_attributes(cls) & methods
            assert not shadowed, (
                f"{cls.__qualname__} stores attributes named like {prims.__qualname__}'s "
                f"methods: {sorted(shadowed)}"
            )


def test_the_check_sees_a_shadowing_attribute():
    class Shadowing:
        def __init__(self):
            self.signal = object()

        def signal(self, op, deps):  # noqa: F811 - the collision under test
            pass

    assert "signal" in _assigned_self_attributes(Shadowing)
