"""``--json`` is strict JSON: what a verify-only backend did not time is null, not Python's
``NaN`` (which jq, JavaScript and most loaders refuse)."""

import json

from ficco.cli.common import json_text


def strict(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_text_writes_null_for_values_not_measured():
    payload = {"a": float("nan"), "b": [1.5, float("inf")], "c": (float("-inf"),), "d": "x"}
    assert strict(json_text(payload)) == {"a": None, "b": [1.5, None], "c": [None], "d": "x"}
    assert strict(json_text({"v": 2}, default=float)) == {"v": 2}
