"""Import layering check for solrl_core: every import, function-level ones included.

Reads each module's source with ``ast`` (nothing is imported), resolves every ``import`` and
``from ... import`` to the solrl_core modules it names, and prints:

- each import of ``flows`` or ``tasks`` from inside solrl_core (the library must not depend on
  its orchestrator);
- each import cycle among solrl_core modules (a strongly connected component of more than one
  module, or a module importing itself), with one import edge per line to show where it closes;
- each import inside a function that does not say why it is deferred, as ``file:line``. Imports
  belong at the top of the module; one kept inside a function (for start-up time, or because the
  package is an optional extra) carries a comment on its own line or on the line above, in one of
  two forms: ``# deferred: <package> at import time (start-up of <what>)`` or ``# deferred:
  optional package <name>``. One such comment also covers the imports directly below it.

Exits 1 when it finds any of these, 0 otherwise. ``import`` inside ``if TYPE_CHECKING:`` is
skipped: it never runs.

    python scripts/import_cycles.py [ROOT]      # ROOT: the repository (default: this script's parent's parent)
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "solrl_core"
ORCHESTRATION = ("flows", "tasks")
# The reason a function-level import gives: a package slow to import, or an optional one.
DEFERRED = re.compile(r"#\s*deferred:\s*(optional package \S+|\S.*\bat import time\b)")


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    line: int


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth (functions, classes, try blocks)."""
    found = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def function_level_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run and sits inside a function (or a method, or a lambda)."""
    found = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, in_function) for child in node.orelse)
            continue
        if in_function and isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))
    return sorted(found, key=lambda node: node.lineno)


def undeclared_deferrals(path: Path) -> list[int]:
    """Lines of the function-level imports in ``path`` that no ``# deferred:`` comment explains."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    explained: set[int] = set()  # last lines of explained imports: an import right below shares the comment
    missing = []
    for node in function_level_imports(ast.parse(source, str(path))):
        first, last = node.lineno, node.end_lineno or node.lineno
        own = any(DEFERRED.search(line) for line in lines[first - 1:last])
        above = first - 1
        heading = above >= 1 and (DEFERRED.match(lines[above - 1].strip()) is not None or above in explained)
        if own or heading:
            explained.add(last)
        else:
            missing.append(first)
    return missing


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest package module that ``name`` is or lies in (``a.b.c`` -> ``a.b`` if only it exists)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def edges_of(module: str, path: Path, modules: dict[str, Path]) -> tuple[list[Edge], list[Edge]]:
    """(imports of package modules, imports of the orchestration packages) made by ``module``."""
    is_package = path.name == "__init__.py"
    inner, outward = [], []
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = _absolute(module, is_package, node)
            # ``from pkg import sub`` imports the submodule pkg.sub when there is one.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for name in names:
            if name.split(".")[0] in ORCHESTRATION:
                outward.append(Edge(module, name, node.lineno))
                continue
            target = _known(name, modules)
            if target is not None and target != module:
                inner.append(Edge(module, target, node.lineno))
            elif target == module and name != module:  # pragma: no cover - a module naming itself
                inner.append(Edge(module, target, node.lineno))
    return inner, outward


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: components in reverse topological order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def report(root: Path) -> tuple[list[list[Edge]], list[Edge], list[str]]:
    """(cycles, each as the import edges inside its component; imports of flows/tasks; function-level
    imports without a ``# deferred:`` comment, as ``file:line`` relative to ``root``)."""
    modules = module_files(root)
    inner: list[Edge] = []
    outward: list[Edge] = []
    unexplained: list[str] = []
    for module, path in modules.items():
        found_inner, found_outward = edges_of(module, path, modules)
        inner += found_inner
        outward += found_outward
        unexplained += [f"{path.relative_to(root).as_posix()}:{line}" for line in undeclared_deferrals(path)]
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for edge in inner:
        graph[edge.source].add(edge.target)
    cycles = []
    for component in strongly_connected(graph):
        members = set(component)
        if len(component) > 1 or component[0] in graph[component[0]]:
            cycles.append([edge for edge in inner if edge.source in members and edge.target in members])
    return cycles, outward, unexplained


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else Path(__file__).resolve().parent.parent
    cycles, outward, unexplained = report(root)
    for edge in sorted(set(outward), key=lambda e: (e.source, e.line)):
        print(f"{edge.source} imports {edge.target} (line {edge.line}): solrl_core must not import flows/ or tasks/")
    for number, edges in enumerate(cycles, 1):
        members = sorted({edge.source for edge in edges})
        print(f"cycle {number}: {len(members)} modules: {', '.join(members)}")
        for edge in sorted(set(edges), key=lambda e: (e.source, e.line, e.target)):  # one line per import
            print(f"  {edge.source}:{edge.line} -> {edge.target}")
    for place in unexplained:
        print(f"{place}: import inside a function with no '# deferred:' comment")
    if unexplained:
        print("move each to the top of its module, or say on the line above why it waits: '# deferred: <package> "
              "at import time (start-up of <what>)' or '# deferred: optional package <name>'")
    if cycles or outward or unexplained:
        return 1
    print(f"no import cycles in {PACKAGE}, and no import of {' or '.join(ORCHESTRATION)} from it; "
          "every function-level import says why it is deferred")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
