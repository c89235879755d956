"""brrr's import graph, read from the sources with `ast`: no cycles, and each stage keeps its contract.

The rule for what counts as an import:
- every `import` and `from ... import` statement in a module, at module level or inside a function: a function
  that imports lazily to break a cycle still ties the two modules together, so it counts;
- `import a.b.c` is an edge to a.b.c; `from a.b import c` is an edge to a.b.c where that is a module, else to
  a.b; relative imports are resolved first;
- the packages above an imported module are not edges, although Python runs their `__init__.py` first: a
  package may import its own modules to have them register (lowering/__init__.py imports core, then the op
  families that fill core's tables). Each `__init__.py` is itself a module of the graph, with its own imports.

Each stage folder of brrr/compile states in its `__init__.py` docstring, on a line of its own, what its modules
must not import (`Must not import: lowering, backend, runtime.compiled.`: folders or modules of brrr.compile).
The shared modules (cache.py, fallbacks.py) import nothing of brrr. Every module of brrr/compile opens with a
docstring, and no module of brrr is longer than 800 lines.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPILE = "brrr.compile"
SHARED = ("brrr.compile.cache", "brrr.compile.fallbacks")
MAX_LINES = 800


def modules():
    """{dotted name: path} of every module under brrr/."""
    found = {}
    for path in sorted((ROOT / "brrr").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name, path, known):
    """The modules of `known` that module `name` imports (see the module docstring for the rule)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]

    def nearest(dotted):
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted

    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [nearest(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:   # relative: from the package `level - 1` above this module's
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else nearest(base)
                       for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t and t != name)
    return out


def import_graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each as one cycle through it."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(cycle_through(graph, component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycle_through(graph, component):
    """One cycle inside `component`, as [a, b, ..., a]: a breadth-first walk from its first module back to it."""
    start = min(component)
    parent, frontier = {start: None}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if w not in parent:
                    parent[w] = v
                    following.append(w)
        frontier = following
    return sorted(component)


def forbidden_imports(package_path):
    """What a stage's `__init__.py` docstring says its modules must not import, as dotted names."""
    doc = ast.get_docstring(ast.parse(package_path.read_text())) or ""
    found = re.search(r"^Must not import: (.+?)\.?$", doc, re.M)
    return [f"{COMPILE}.{item.strip()}" for item in found.group(1).split(",")] if found else None


def test_the_finder_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_brrr_has_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join("  " + " -> ".join(cycle) for cycle in found)


def test_every_stage_says_what_it_must_not_import_and_keeps_to_it():
    graph = import_graph()
    stages = [p for p in sorted((ROOT / "brrr" / "compile").iterdir()) if (p / "__init__.py").exists()]
    assert {p.name for p in stages} >= {"passes", "ir", "lowering", "scheduling", "codegen", "matmul", "runtime"}
    broken = []
    for stage in stages:
        forbidden = forbidden_imports(stage / "__init__.py")
        assert forbidden, f"{stage.name}/__init__.py does not say what it must not import"
        prefix = f"{COMPILE}.{stage.name}"
        for name, targets in graph.items():
            if name != prefix and not name.startswith(prefix + "."):
                continue
            broken += [f"{name} imports {t}" for t in sorted(targets)
                       if any(t == f or t.startswith(f + ".") for f in forbidden)]
    assert not broken, "\n".join(broken)


def test_the_shared_modules_import_nothing_of_brrr():
    graph = import_graph()
    for name in SHARED:
        assert not {t for t in graph[name] if t.startswith("brrr")}, name


def test_modules_are_short_and_say_what_they_are():
    for name, path in modules().items():
        assert len(path.read_text().splitlines()) <= MAX_LINES, f"{name} is over {MAX_LINES} lines"
        if name.startswith(COMPILE):
            assert ast.get_docstring(ast.parse(path.read_text())), f"{name} has no docstring"
