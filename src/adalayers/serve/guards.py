"""Server-side guards: a policy the operator sets with `adalayers serve --guard`, applied to every request.

    adalayers serve BASE HEADS --guard "toxic:toxic>=0.8" --guard "score>=2.5" \\
        --guard-message "I can't help with that." --guard-log guard.jsonl [--guard-log-text]

A rule is HEAD:LABEL>=P (a sequence head's label at least probability P) or HEAD>=V (a regression head's
value at least V). The rules join every request's own guards (a client's guards add rules, never remove
one): on the generation routes they are checked on the prompt after the prefill and at every generated token
(infer/generate: the row ends, finish "guard"; the /v1 routes say finish_reason "content_filter" and carry the
refusal text); on /predict and /v1/classify the rows that trip a rule are marked. Every trip is counted per
head and label (GET /metrics: adalayers:guard_stops_total{head,label}; GET /health: "guard_stops") and, with
--guard-log, written as one
JSON line: time, request id, route, head, label, value, token (0: the prompt, k: the k-th generated token;
null on /predict), and the text only with --guard-log-text.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from adalayers.errors import ConfigError
from adalayers.infer.params import GenerationParams
from adalayers.kinds import TaskKind

log = logging.getLogger(__name__)

RULE = re.compile(r"^\s*(?P<head>[^:>=\s]+)\s*(?::\s*(?P<label>[^>=]+?)\s*)?>=\s*(?P<value>\S+)\s*$")
MESSAGE = "This request was stopped by the service's content guard."


@dataclass(frozen=True)
class Rule:
    """Trip when head `head` gives `label` at least `threshold` (label None: a regression head's value)."""
    head: str
    label: str | None
    threshold: float

    def __str__(self) -> str:
        return f"{self.head}{':' + self.label if self.label is not None else ''}>={self.threshold:g}"


def parse_rule(spec: str) -> Rule:
    """'HEAD:LABEL>=P' or 'HEAD>=V' -> Rule; ConfigError naming the problem."""
    m = RULE.match(spec or "")
    if not m:
        raise ConfigError(f"--guard {spec!r}: expected HEAD:LABEL>=P (a label's probability) or HEAD>=V "
                          "(a regression head's value)")
    try:
        value = float(m["value"])
    except ValueError:
        raise ConfigError(f"--guard {spec!r}: {m['value']!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"--guard {spec!r}: the threshold must be a finite number")
    if m["label"] is not None and not 0.0 <= value <= 1.0:
        raise ConfigError(f"--guard {spec!r}: a label's threshold is a probability, 0 to 1")
    return Rule(m["head"], m["label"], value)


def checked_rules(specs: list[str], side) -> list[Rule]:
    """The rules, each on a loaded sequence head (a label of it, or a regression head with none)."""
    rules = [parse_rule(s) for s in specs or []]
    for r in rules:
        head = side.heads.get(r.head)
        if head is None:
            raise ConfigError(f"--guard {r}: no head {r.head!r}; loaded: {', '.join(side.names)}")
        if head.kind == TaskKind.TOKENS:
            raise ConfigError(f"--guard {r}: {r.head!r} is a token head; a guard reads a sequence head")
        if head.kind == TaskKind.REGRESSION and r.label is not None:
            raise ConfigError(f"--guard {r}: {r.head!r} is a regression head: write {r.head}>=VALUE")
        if head.kind != TaskKind.REGRESSION and r.label not in head.task.labels:
            raise ConfigError(f"--guard {r}: {r.head!r} has the labels {', '.join(head.task.labels)}; "
                              f"write {r.head}:LABEL>=P")
    return rules


class GuardPolicy:
    """The server's rules, the refusal text, the stop counts and the audit log (see the module doc)."""

    def __init__(self, rules: list[Rule], message: str = MESSAGE, log_path: str | None = None,
                 log_text: bool = False, metrics=None):
        self.rules, self.message, self.log_path, self.log_text = list(rules), message or MESSAGE, log_path, log_text
        self.stops: Counter = Counter()  # (head, label) -> trips
        self._counter = None if metrics is None else metrics.counter(  # serve/metrics.Metrics: GET /metrics
            "guard_stops", "Guard trips (generations stopped, /predict rows marked), by head and label "
                           "(label empty: a regression head)", ["head", "label"])
        self._lock = threading.Lock()
        if log_path:
            open(log_path, "a", encoding="utf-8").close()  # a path that cannot be written fails at startup

    @classmethod
    def from_config(cls, cfg, side, metrics=None) -> GuardPolicy:
        return cls(checked_rules(cfg.guard or [], side), cfg.guard_message, cfg.guard_log, cfg.guard_log_text,
                   metrics)

    @property
    def heads(self) -> list[str]:
        return list(dict.fromkeys(r.head for r in self.rules))

    def merged(self, client: dict | None) -> dict:
        """A request's guard {head: (label, threshold)} with the server's rules added: {head: [rules]}."""
        out: dict[str, list] = {}
        for r in self.rules:
            out.setdefault(r.head, []).append((r.label, r.threshold))
        for head, rule in (client or {}).items():
            for lab, th in (rule if isinstance(rule, list) else [rule]):
                out.setdefault(head, []).append((lab, float(th)))
        return out

    def tasks(self, tasks: list[str] | None) -> list[str] | None:
        """The heads a request asks for, with the guard heads (None, every head, holds them already)."""
        return None if tasks is None else list(dict.fromkeys(list(tasks) + self.heads))

    # --- generation -------------------------------------------------------------------------------
    def wrap(self, decode: Callable) -> Callable:
        """ServeState.decode with the policy: decode(prompts, params, route=..., request_id=...): the server's
        rules joined to the request's guard (and its heads to the tasks), the trips recorded as it ends."""
        def guarded(prompts: list[str], params: GenerationParams, route: str = "generate",
                    request_id: str | None = None):
            if self.rules:
                tasks = self.tasks(None if params.tasks is None else list(params.tasks))
                params = replace(params, guard=tuple(self.merged(params.guards).items()),
                                 tasks=None if tasks is None else tuple(tasks))
            events = decode(prompts, params)
            rid = request_id or uuid.uuid4().hex
            return type(events)(self._recording(events, route, rid), events.job)
        return guarded

    def _recording(self, events, route: str, rid: str) -> Iterator[dict]:
        try:
            for event in events:
                if event["event"] == "done":
                    for r in event["results"]:
                        if r.get("guard"):
                            self.record(route, rid, r["guard"], r["prompt"] + "\n" + r["text"])
                yield event
        finally:
            events.close()

    # --- texts ------------------------------------------------------------------------------------
    def text_tasks(self, side, tasks: list[str] | None, pairs: bool) -> list[str] | None:
        """The heads a /predict-like request runs: its own, plus the guard heads that read its input
        (sentence pairs or single texts)."""
        if tasks is None:
            return None
        return list(dict.fromkeys(list(tasks) + [h for h in self.heads if bool(side.heads[h].pairs) == pairs]))

    def mark(self, results: list[dict], texts: list[str], route: str, asked: list[str] | None) -> list[dict]:
        """/predict's results with "guard": [tripped rules] on the rows that trip one (recorded), and the
        guard heads' outputs left out where the request did not ask for them (asked None: every head)."""
        rid = uuid.uuid4().hex
        for res, text in zip(results, texts):
            trips = []
            for r in self.rules:
                out = res["tasks"].get(r.head)
                if out is None:
                    continue
                value = out["value"] if r.label is None else out["probabilities"][r.label]
                if value >= r.threshold:
                    trips.append({"head": r.head, "label": r.label, "value": value, "token": None})
            for t in trips:
                self.record(route, rid, t, text)
            if trips:
                res["guard"] = trips
            if asked is not None:
                for h in self.heads:
                    if h not in asked:
                        res["tasks"].pop(h, None)
        return results

    # --- records ----------------------------------------------------------------------------------
    def record(self, route: str, request_id: str, trip: dict, text: str | None = None) -> None:
        """Count one trip and append it to the audit log (when one is set)."""
        with self._lock:
            self.stops[(trip["head"], trip["label"])] += 1
            if self._counter is not None:
                self._counter.labels(head=trip["head"], label=trip["label"] or "").inc()
            if not self.log_path:
                return
            line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() % 1 * 1000):03d}Z",
                    "request_id": request_id, "route": route, "head": trip["head"], "label": trip["label"],
                    "value": trip["value"], "token": trip["token"]}
            if self.log_text and text is not None:
                line["text"] = text
            try:
                with open(self.log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(line, ensure_ascii=False) + "\n")
            except OSError as e:
                log.error("the guard log %s cannot be written: %s", self.log_path, e)

    def stats(self) -> dict:
        """{"HEAD:LABEL" (or "HEAD" for a regression head): trips so far}."""
        with self._lock:
            return {f"{h}:{lab}" if lab is not None else h: n for (h, lab), n in sorted(self.stops.items(), key=str)}
