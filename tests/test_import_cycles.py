"""No import cycle in workflow_scripts/: a cycle works only while one side imports lazily or late, and breaks (a
partially initialised module) as soon as someone moves an import to the top, where the style wants it.

Every import statement counts, those inside functions too (a lazy import hides a cycle, it does not remove it).
Importing `a.b.c` also runs the packages `a` and `a.b`, so it counts as importing them, but for the importer's
own packages (they ran before it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "workflow_scripts"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py")) if "__pycache__" not in p.parts}


def _with_packages(target: str, importer: str, known: dict[str, Path]) -> list[str]:
    """`target` and the packages above it that importing it runs (the project's, less the importer's own)."""
    parts = target.split(".")
    above = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [m for m in above if m in known and not importer.startswith(m + ".")] + ([target] if target in known else [])


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules that `name` (at `path`) imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a.b import c`: c is a submodule, or a name in a.b
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            found.update(_with_packages(target, name, known))
    found.discard(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, the modules visited in sorted order)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_workflow_scripts_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and graph[f"{PACKAGE}.analysis.tables"], "the walk found no modules or no imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_walk_sees_lazy_and_relative_imports(tmp_path: Path):
    """The walk on a made-up package: a cycle closed by an import inside a function, and one through a relative
    import and a package's __init__."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from workflow_scripts.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from workflow_scripts import a\n")
    (pkg / "sub" / "__init__.py").write_text("from .c import g\n")
    (pkg / "sub" / "c.py").write_text("import workflow_scripts.sub.d\n")
    (pkg / "sub" / "d.py").write_text("from . import c\n")
    graph = import_graph(tmp_path)
    assert graph["workflow_scripts.b"] == {"workflow_scripts.a"}
    assert find_cycle(graph) == ["workflow_scripts.a", "workflow_scripts.b", "workflow_scripts.a"]
    graph["workflow_scripts.b"].discard("workflow_scripts.a")
    assert graph["workflow_scripts.sub"] == {"workflow_scripts.sub.c"}
    assert find_cycle(graph) == ["workflow_scripts.sub.c", "workflow_scripts.sub.d", "workflow_scripts.sub.c"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None
