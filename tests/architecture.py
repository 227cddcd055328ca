"""The shape of the package, read from its source: the import graph, its circles, imports that run up a floor,
and long functions and modules. tests/test_architecture.py holds the limits; `python tests/architecture.py`
prints the report.

Floors, from the bottom (a module may import its own floor and the floors below it):
    0  the foundation: adalayers.{errors, kinds, config, core, jsoncheck, textcheck, progress, entities, metrics,
       raylocal}
    1  engine (the one fit loop and predict loop: knows nothing of data, models or run folders)
    2  data      3  model      4  store      5  recipes, infer, export      6  serve, bulk      7  cli
The lab (adalayers.lab) sits above them all: it imports the product, the product never imports it.
No module imports the CLI but adalayers.__main__ (and the CLI's own modules): the lab and the benchmarks call the
application service, adalayers.recipes.service, as the CLI does.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
FLOORS = {"engine": 1, "data": 2, "model": 3, "store": 4, "recipes": 5, "infer": 5, "export": 5, "serve": 6,
          "bulk": 6, "cli": 7, "__main__": 7}
LAB = "lab"
CLI = "adalayers.cli"


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__) for every module under src/adalayers."""
    out = {}
    for path in sorted((SRC / "adalayers").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def _target(name: str, mods: dict) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports() -> dict[str, set[str]]:
    """Module -> the adalayers modules it imports (anywhere in the file: lazy imports count)."""
    mods = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, (path, package) in mods.items():
        here = mod if package else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                target = _target(name, mods) if name.startswith("adalayers") else None
                if target and target != mod:
                    edges[mod].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in sorted(set(edges) | {t for ts in edges.values() for t in ts}):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def floor(mod: str) -> int | None:
    """The module's floor; None for the lab."""
    first = mod.split(".")[1] if "." in mod else ""
    return None if first == LAB else FLOORS.get(first, 0)


def up_imports(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Product imports that run from a floor to a higher one."""
    return sorted((a, b) for a, ts in edges.items() for b in ts
                  if floor(a) is not None and floor(b) is not None and floor(b) > floor(a))


def cli_imports(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Modules outside the CLI that import it (product or lab): only adalayers.__main__ may. The CLI parses a
    command line and calls the product; what a command does lives below it (adalayers.recipes.service)."""
    def in_cli(mod: str) -> bool:
        return mod == CLI or mod.startswith(CLI + ".")

    return sorted((a, b) for a, ts in edges.items() for b in ts
                  if in_cli(b) and not in_cli(a) and a != "adalayers.__main__")


def lab_imports(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Product modules that import the lab."""
    return sorted((a, b) for a, ts in edges.items() for b in ts if floor(a) is not None and floor(b) is None)


def _names(node: ast.AST) -> set[str]:
    """The names and attribute names an expression reads (`state.batcher` -> {"state", "batcher"})."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def batcher_members() -> set[str]:
    """The attributes and methods of the Batcher protocol (serve/batching.py)."""
    path = SRC / "adalayers" / "serve" / "batching.py"
    if not path.exists():
        return set()
    (cls,) = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "Batcher"]
    return {n.target.id if isinstance(n, ast.AnnAssign) else n.name for n in cls.body
            if isinstance(n, (ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef))}


def batcher_probes() -> list[tuple[str, int]]:
    """(module, line) of every hasattr/getattr on a batcher: its object an expression that names a batcher, or the
    attribute asked for one of the Batcher protocol's. The contract is serve/batching.Batcher, never probed."""
    members, out = batcher_members(), []
    for mod, (path, _) in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2):
                continue
            named = any("batcher" in name.lower() for name in _names(node.args[0]))
            asked = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
            if named or asked in members:
                out.append((mod, node.lineno))
    return sorted(out)


def runtime_lists(names: set[str], home: str = "adalayers.runtimes") -> list[tuple[str, int]]:
    """(module, line) of every tuple, list or set literal outside `home` that holds two or more runtime names
    (`names`): the runtimes are listed once, in their registry."""
    out = []
    for mod, (path, _) in modules().items():
        if mod == home:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                held = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if len(held & names) >= 2:
                    out.append((mod, node.lineno))
    return sorted(out)


def long_functions(limit: int) -> list[tuple[str, int]]:
    """(module:function, lines) for every function or method longer than `limit` lines."""
    out = []
    for mod, (path, _) in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append((f"{mod}:{node.name}", lines))
    return sorted(out, key=lambda x: -x[1])


def long_modules(limit: int) -> list[tuple[str, int]]:
    """(module, lines) for every module longer than `limit` lines."""
    out = [(mod, len(path.read_text().splitlines())) for mod, (path, _) in modules().items()]
    return sorted([m for m in out if m[1] > limit], key=lambda x: -x[1])


if __name__ == "__main__":
    edges = imports()
    report = {"circles": circles(edges), "up a floor": up_imports(edges), "product -> lab": lab_imports(edges),
              "imports of the CLI": cli_imports(edges),
              "functions > 80 lines": long_functions(80), "modules > 400 lines": long_modules(400),
              "hasattr/getattr on a batcher": batcher_probes(),
              "runtime names listed outside adalayers.runtimes": runtime_lists({"torch", "onnx", "onnx-int8",
                                                                                 "llama.cpp"})}
    for title, items in report.items():
        print(f"{title}: {len(items)}")
        for item in items:
            print("   ", item)
    sys.exit(0)
