"""The heads a Predictor serves: one trained run folder each (Head), named as RUN or NAME=RUN (a HeadSpec,
parsed once where it enters: adalayers.store.head_spec).

    heads = load_heads(runtime.base, parse_heads(["runs/cola", "tags=runs/conll"]))  # refuses a head of another base
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from adalayers.data.tasks import takes_pairs
from adalayers.data.templates import Template
from adalayers.errors import ModelError
from adalayers.store import run as runlib
from adalayers.store.head_spec import HeadSpec


@dataclass
class Head:
    name: str
    task: object          # SideTask
    run_dir: Path
    max_length: int
    pairs: bool = False   # trained on sentence pairs: takes (text, text_pair), refuses single texts
    template: Template = Template()  # task.template it was trained with: its inputs are wrapped the same way

    @property
    def kind(self) -> str:
        return self.task.kind

    def describe(self) -> dict:
        w = self.task.layer_weights().tolist()  # a torch SideTask's, or a numpy Task's (the torch-free path)
        return {"name": self.name, "kind": self.kind, "pairs": self.pairs, "labels": self.task.labels,
                "layer_weights": [round(x, 6) for x in w], "used_layers": self.task.used_layers(),
                "max_length": self.max_length}  # never the run folder's path: clients need not know it


def used_layers(heads: list[Head]) -> list[int]:
    """The states any of the heads reads, in order (the last one: where a pass without the base's own output may
    stop)."""
    return sorted(set().union(*(h.task.used_layers() for h in heads)))


def heads_base(heads: list[HeadSpec]) -> str:
    """The base the heads were trained on (their config.json's base name), when they all name the same one;
    otherwise a ModelError that lists them and names --base."""
    named = {str(h.path): runlib.read_config(h.path)["base"]["name"] for h in heads}
    bases = sorted(set(named.values()))
    if not bases:
        raise ModelError("no heads given, so no base to load: name one with --base")
    if len(bases) > 1:
        raise ModelError(f"the heads were trained on different bases ({', '.join(f'{a}: {b}' for a, b in named.items())}); "
                         f"serve the heads of one base together, or choose the base with --base")
    return bases[0]


def load_heads(base, specs: list[HeadSpec], read=None) -> list[Head]:
    """The heads named by `specs` on `base`, each checked against the base's fingerprint and number of layers.
    `read(run_dir, base) -> (task, Config)`: how a run folder becomes a task (default: the torch SideTask on the
    base's device; the torch-free path reads numpy tasks, adalayers.infer.numpy_runs)."""
    heads = []
    for name, path in ((s.name, s.path) for s in specs):
        task, cfg = (read or _torch_task)(path, base)  # refuses a head trained on another base
        if len(task.layer_weights()) != base.num_layers:
            raise ModelError(f"{path}: head expects {len(task.layer_weights())} layers, base has {base.num_layers}")
        heads.append(Head(name, task, path, cfg.model.max_length, takes_pairs(cfg), Template.of(cfg)))
    return heads


def _torch_task(path: Path, base):
    task, cfg, _ = runlib.load_head(path, base)
    return task.to(base.device).eval(), cfg


def heads_states(heads: list[HeadSpec]) -> str:
    """The hidden states ("encoder" or "decoder") the heads read; one kind per Predictor."""
    states = {runlib.read_config(h.path)["config"].get("model", {}).get("states", "encoder") for h in heads}
    if len(states) > 1:
        raise ModelError(f"the heads read different hidden states ({', '.join(sorted(states))}); "
                         "serve encoder and decoder heads separately")
    return states.pop() if states else "encoder"


def input_kind(head: Head) -> str:
    return "sentence pairs" if head.pairs else "single texts"
