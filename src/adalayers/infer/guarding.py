"""Guards on a generation: rules {head: [(label, threshold), ...]} checked on the prompt and after every token.

A rule trips when its head gives `label` at least `threshold` (label None: a regression head's value at least
the threshold). infer/generate checks them on each prompt after the prefill (a row that trips ends there,
having generated nothing) and on prompt + answer after every generated token (the row ends with that token);
the row's result then says which rule: "guard": {head, label, value, token} (token 0: the prompt, k: the
k-th generated token). serve/guards.py adds the server's rules to every request's.
"""
from __future__ import annotations

from adalayers.errors import DataError
from adalayers.kinds import TaskKind


def guard_rules(side, guard: dict | None) -> dict[str, list[tuple[str | None, float]]]:
    """{head: (label, threshold)} or {head: [(label, threshold), ...]} -> {head: [rules]}, checked: a sequence
    head and one of its labels, or a regression head and no label (DataError naming the problem)."""
    rules = {n: [(lab, float(th)) for lab, th in (given if isinstance(given, list) else [given])]
             for n, given in (guard or {}).items()}
    for n, given in rules.items():
        head = side.heads[n]
        for lab, _ in given:
            if head.kind == TaskKind.REGRESSION and lab is None:
                continue
            if head.kind in (TaskKind.TOKENS, TaskKind.REGRESSION) or lab not in head.task.labels:
                raise DataError(f"guard on {n!r}: needs a sequence head and one of its labels "
                                f"({', '.join(head.task.labels)}), or a regression head and no label; got {lab!r}")
    return rules


def guard_trip(side, guard: dict, values: dict, token: int) -> dict | None:
    """The first rule of guard {head: [(label, threshold)]} that the heads' values (per head: class probabilities,
    or a regression head's value) trip, as {head, label, value, token}; None when none does."""
    for n, rules in guard.items():
        for label, threshold in rules:
            v = values[n]
            value = float(v.reshape(-1)[0]) if label is None else float(v[side.heads[n].task.labels.index(label)])
            if value >= threshold:
                return {"head": n, "label": label, "value": value, "token": token}
    return None


def prompt_trips(side, job, rows: list, values: dict) -> None:
    """After the prefill: each of the job's rows whose prompt trips one of its rules (those of heads that read
    the prompt, not the answer alone) ends with finish "guard" (Row.guard says which). values: {head: per prompt}."""
    checked = {n: rules for n, rules in job.guard.items() if n not in job.answer_only}
    for j, row in enumerate(rows):
        row.guard = guard_trip(side, checked, {n: values[n][j] for n in checked}, 0) if checked else None
        row.finish = "guard" if row.guard else None
