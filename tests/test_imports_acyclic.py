"""No import cycle inside ficco, and no import up a floor.

The graph is built from the AST of every module under ficco/: an edge for every ``import
ficco...`` and ``from ficco... import ...`` anywhere in a module (module level, inside
functions and under ``if TYPE_CHECKING:`` alike: a lazy or a type-only import still ties the
two modules together, and a type-only circle is a circle a reader must untangle). ``from
ficco.a import b`` points at ``ficco.a.b`` when that is a module, else at ``ficco.a``. A
package's ``__init__`` is the module ``ficco.a``. A registry names code of a higher floor by
``"module:attribute"`` (``ficco.patterns.spec.Ref``), which is no import.

The floors (:data:`FLOORS`, bottom first; DESIGN.md section 3): a module may import its own
floor and those below, never one above.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / "ficco").rglob("*.py"))}


#: ``(floor, module prefixes)``, bottom first. A module's floor is that of its longest
#: matching prefix; ``=name`` matches the module ``name`` alone (a registry package below its
#: own plug-ins).
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "vocabulary",
        (
            "ficco.version",
            "ficco.validate",
            "ficco.defaults",
            "ficco.verdict",
            "ficco.tabular",
            "ficco.shipped",
            "ficco.dtypes",
            "ficco.outputs",
            "ficco.words",
            # machine descriptions are data (JSON read into a dataclass): the physical floor
            # of a timing and the cost model both read them
            "ficco.model.machine",
        ),
    ),
    # the pattern registry: the enum, the spec type, the lookup that Problem reads
    ("pattern registry", ("=ficco.patterns", "ficco.patterns.spec")),
    (
        "problem",
        (
            "ficco.problem",
            "ficco.routing",
            "ficco.workloads",
            "ficco.workloads_dlrm",
            "ficco.workloads_models",
        ),
    ),
    ("space", ("ficco.space",)),
    # each pattern's spec: rules and sizes over problems and schedules
    ("patterns", ("ficco.patterns",)),
    ("plan", ("ficco.plan",)),
    # what every runner, tuner and benchmark shares: the timing protocol and its options,
    # the measurement record
    (
        "timing and records",
        (
            "ficco.execute.options",
            "ficco.execute.timing",
            "ficco.measure.record",
            "ficco.measure.repeat",
            "ficco.measure.floor",
        ),
    ),
    ("kernels", ("ficco.kernels",)),
    ("execute", ("ficco.execute", "ficco.backends")),
    ("measure", ("ficco.measure",)),
    ("profile", ("ficco.profile",)),
    ("sweep, select, model", ("ficco.sweep", "ficco.select", "ficco.model")),
    ("export", ("ficco.export", "ficco.testing")),
    ("api", ("ficco.api",)),
    ("fronts", ("ficco.ops", "ficco.cli", "=ficco")),
)


def floor_of(module: str) -> int:
    """The index in :data:`FLOORS` of ``module``'s floor (KeyError: none matches)."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if prefix.startswith("="):
                if module == prefix[1:]:
                    return index
            elif (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[1]
            ):
                best = (index, len(prefix))
    if best is None:
        raise KeyError(f"{module}: in no floor of FLOORS")
    return best[0]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import up a floor, as ``'a (floor) -> b (floor)'``."""
    return [
        f"{a} ({FLOORS[floor_of(a)][0]}) -> {b} ({FLOORS[floor_of(b)][0]})"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if floor_of(b) > floor_of(a)
    ]


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] == "ficco":
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    found.add(full if full in known else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    found.discard(name)
    return {m for m in found if m in known}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        color[node] = GREY
        stack.append(node)
        for nxt in sorted(graph[node]):
            if color[nxt] == GREY:
                return stack[stack.index(nxt) :] + [nxt]
            if color[nxt] == WHITE and (cycle := dfs(nxt)):
                return cycle
        stack.pop()
        color[node] = BLACK
        return None

    for node in sorted(graph):
        if color[node] == WHITE and (cycle := dfs(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def test_a_type_only_import_is_an_edge(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ficco.problem import Problem\n"
    )
    assert imports_of("ficco.m", path, {"ficco.problem", "ficco.m"}) == {"ficco.problem"}


def test_the_floor_check_finds_an_import_up_a_floor():
    assert (
        floor_of("ficco.patterns") < floor_of("ficco.problem") < floor_of("ficco.patterns.ag_gemm")
    )
    assert floor_of("ficco.execute.timing") < floor_of("ficco.kernels.tuning")
    assert upward(
        {"ficco.kernels.matmul": {"ficco.execute.cuda"}, "ficco.execute.cuda": set()}
    ) == ["ficco.kernels.matmul (kernels) -> ficco.execute.cuda (execute)"]
    assert (
        upward({"ficco.execute.cuda": {"ficco.kernels.matmul"}, "ficco.kernels.matmul": set()})
        == []
    )


def test_no_import_cycle_inside_ficco():
    edges = graph()
    assert edges["ficco.execute.measure"] >= {"ficco.execute.interpreter", "ficco.plan"}
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_every_module_has_a_floor():
    for name in modules():
        floor_of(name)


def test_no_import_runs_up_a_floor():
    assert upward(graph()) == []
