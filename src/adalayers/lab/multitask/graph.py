"""The progressive-sharing graph: task -> the tasks whose head outputs it reads."""
from __future__ import annotations

from adalayers.errors import ConfigError


def order(specs) -> list[str]:
    """Task names, every task after the tasks it depends on; a cycle raises ConfigError naming it."""
    deps = {s.name: list(s.depends_on) for s in specs}
    done, path, out = set(), [], []

    def visit(name):
        if name in done:
            return
        if name in path:
            cycle = path[path.index(name):] + [name]
            raise ConfigError(f"tasks: depends_on forms a cycle: {' -> '.join(cycle)}")
        path.append(name)
        for d in deps.get(name, []):
            visit(d)
        path.pop()
        done.add(name)
        out.append(name)

    for s in specs:
        visit(s.name)
    return out


def upstream(specs, name: str) -> set[str]:
    """Every task whose head `name` reads, directly or through other heads."""
    deps = {s.name: list(s.depends_on) for s in specs}
    seen, todo = set(), list(deps[name])
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo += deps[d]
    return seen
