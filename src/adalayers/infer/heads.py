"""The heads a Predictor serves: one trained run folder each (Head), named on the command line as RUN or NAME=RUN.

    heads = load_heads(runtime.base, ["runs/cola", "tags=runs/conll"])   # refuses a head of another base
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from adalayers.data.tasks import takes_pairs
from adalayers.data.templates import Template
from adalayers.errors import ConfigError, ModelError
from adalayers.store import run as runlib


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
        w = self.task.mixer.layer_weights().tolist()
        return {"name": self.name, "kind": self.kind, "pairs": self.pairs, "labels": self.task.labels,
                "layer_weights": [round(x, 6) for x in w], "used_layers": self.task.used_layers(),
                "max_length": self.max_length}  # never the run folder's path: clients need not know it


def parse_head_arg(arg: str) -> tuple[str, Path]:
    """'runs/cola' -> ('cola', runs/cola); 'acc=runs/cola' -> ('acc', runs/cola).

    A Hub id 'user/name[@rev]' that is not a local folder is fetched (adalayers.store.hub): ('name', its snapshot).
    """
    from adalayers.store.hub import resolve_run

    name, sep, path = arg.partition("=")
    if sep and name and "/" not in name:
        return _task_name(name, arg), resolve_run(path)
    return _task_name(Path(arg.partition("@")[0]).name, arg), resolve_run(arg)


def _task_name(name: str, arg: str) -> str:
    """A task name every answer can carry: valid UTF-8 (argv bytes that are not arrive as lone surrogates)
    and printable."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise ConfigError(f"--heads {shown}: the task name is not valid UTF-8; name it with NAME=RUN_FOLDER") from None
    if not name.isprintable():
        raise ConfigError(f"--heads {arg!r}: the task name holds unprintable characters; name it with NAME=RUN_FOLDER")
    return name


def heads_base(run_dirs: list) -> str:
    """The base the heads in `run_dirs` were trained on (their config.json's base name), when they all
    name the same one; otherwise a ModelError that lists them and names --base."""
    named = {str(arg): runlib.read_config(parse_head_arg(str(arg))[1])["base"]["name"] for arg in run_dirs}
    bases = sorted(set(named.values()))
    if not bases:
        raise ModelError("no heads given, so no base to load: name one with --base")
    if len(bases) > 1:
        raise ModelError(f"the heads were trained on different bases ({', '.join(f'{a}: {b}' for a, b in named.items())}); "
                         f"serve the heads of one base together, or choose the base with --base")
    return bases[0]


def load_heads(base, run_dirs: list) -> list[Head]:
    """The heads in `run_dirs` ('RUN' or 'NAME=RUN', a folder or a Hub id) on `base` (its device), each
    checked against the base's fingerprint and number of layers."""
    heads = []
    for arg in run_dirs:
        name, path = parse_head_arg(str(arg))
        task, cfg, _ = runlib.load_head(path, base)  # refuses a head trained on another base
        if task.mixer.num_layers != base.num_layers:
            raise ModelError(f"{path}: head expects {task.mixer.num_layers} layers, base has {base.num_layers}")
        heads.append(Head(name, task.to(base.device).eval(), path, cfg.model.max_length, takes_pairs(cfg),
                          Template.of(cfg)))
    return heads


def heads_states(run_dirs: list) -> str:
    """The hidden states ("encoder" or "decoder") the heads in `run_dirs` read; one kind per Predictor."""
    states = {runlib.read_config(parse_head_arg(str(r))[1])["config"].get("model", {}).get("states", "encoder")
              for r in run_dirs}
    if len(states) > 1:
        raise ModelError(f"the heads read different hidden states ({', '.join(sorted(states))}); "
                         "serve encoder and decoder heads separately")
    return states.pop() if states else "encoder"


def input_kind(head: Head) -> str:
    return "sentence pairs" if head.pairs else "single texts"
