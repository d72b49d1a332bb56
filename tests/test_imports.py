"""The package's dependencies point one way: no import cycle between modules, and none between
packages (``bytelm.data``, ``bytelm.families``, ``bytelm.training``, ..., and the top-level modules,
each its own node). Read from the source (every import statement, function-local ones included),
so a cycle hidden behind a function-local import is found too."""

import ast
import pathlib

import bytelm

ROOT = pathlib.Path(bytelm.__file__).parent


def module_graph() -> dict[str, set[str]]:
    """Module -> the bytelm modules it imports (``from pkg import name`` counts ``pkg.name`` when that
    is a module)."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("bytelm", *path.relative_to(ROOT).with_suffix("").parts))
        modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("bytelm")
                and node.level == 0
            ):
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("bytelm")]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_modules():
    graph = module_graph()
    assert len(graph) > 50 and graph["bytelm.config"]  # the graph was read
    assert cycles(graph) == []


def test_no_import_cycle_between_packages():
    packages: dict[str, set[str]] = {}
    for module, targets in module_graph().items():
        packages.setdefault(package_of(module), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(module)
        )
    assert cycles(packages) == []
    # the layers the design names: nothing below the families reaches up to them, or to training
    for low in (
        "bytelm.data",
        "bytelm.models",
        "bytelm.patching",
        "bytelm.sampling",
        "bytelm.baselines",
        "bytelm.ledger",
        "bytelm.bpb",
    ):
        assert not packages.get(low, set()) & {
            "bytelm.families",
            "bytelm.training",
            "bytelm.evaluation",
            "bytelm.experiments",
        }, low
    assert "bytelm.sampling" not in packages["bytelm.training"]


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
