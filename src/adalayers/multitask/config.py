"""The settings of a multi-task run: the tasks, the shared base, the trainer and its add-ons."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from adalayers.config import _build, _f, apply_overrides, load_yaml
from adalayers.errors import ConfigError

HEADS = ("sentiment", "bilinear", "cosine", "linear")
SCHEDULES = ("round_robin", "proportional")


@dataclass
class TaskSpec:
    name: str = _f("sst5", "A task from adalayers.tasks (sst5, sst2, qqp, stsb, cola, ...).")
    head: str = _f("linear", "sentiment (linear-GELU-dropout-linear), bilinear (paraphrase: (W1 y1+b1)^T(W2 y2+b2), "
                             "BCE; bi-encoder), cosine (similarity: 5 relu(cos(W1 y1+b1, W2 y2+b2)), MSE; "
                             "bi-encoder), linear (one layer; a pair task reads the cross-encoder input).")
    weight: float = _f(1.0, "This task's loss weight.")
    depends_on: list = _f([], "Tasks whose head outputs this head also reads (progressive sharing).")
    hidden: int = _f(256, "Hidden width of the sentiment head / projection width of bilinear and cosine heads.")
    dropout: float = _f(0.1, "Dropout inside the head.")


@dataclass
class SmartConfig:
    enabled: bool = _f(False, "Add SMART's smoothness regulariser and Bregman proximal term.")
    eps: float = _f(1e-3, "Radius of the infinity-norm ball around the input embeddings.")
    sigma: float = _f(1e-5, "Std of the random start of the perturbation.")
    steps: int = _f(1, "Ascent steps on the perturbation.")
    step_size: float = _f(1e-3, "Ascent step (times the sign of the gradient).")
    lambda_s: float = _f(1.0, "Weight of the smoothness term.")
    mu: float = _f(1.0, "Weight of the Bregman proximal term (0 = off).")
    beta: float = _f(0.99, "Momentum of the EMA copy of the parameters.")


@dataclass
class MultitaskConfig:
    tasks: list = _f([], "The tasks: a list of TaskSpec mappings.")
    base: str = _f("minilm-l6", "Shared base model (alias or folder).")
    max_length: int = _f(64, "Tokens per input (a cross-encoder pair shares them).")
    freeze: str = _f("none", "none (fine-tune every layer), top:N (train only the last N layers), all (frozen).")
    schedule: str = _f("round_robin", "round_robin or proportional (MT-DNN: every batch once, in random order).")
    pcgrad: bool = _f(False, "Gradient surgery on the shared parameters (a step = one batch of every task).")
    freeze_upstream: bool = _f(True, "Upstream heads get no gradient from a downstream task's loss.")
    smart: SmartConfig = field(default_factory=SmartConfig, metadata={"help": "SMART regularisation."})
    lr: float = _f(3e-5, "AdamW learning rate of the base.")
    head_lr: float = _f(1e-3, "AdamW learning rate of the heads.")
    weight_decay: float = _f(0.01, "AdamW weight decay.")
    batch_size: int = _f(16, "Examples per batch.")
    eval_batch_size: int = _f(64, "Examples per batch when evaluating.")
    epochs: int = _f(2, "Epochs; the epoch with the best mean validation metric over the tasks is kept.")
    grad_clip: float = _f(1.0, "Clip the gradient norm (0 = off).")
    seed: int = _f(0, "Seed for initialisation and batch order.")
    precision: str = _f("fp32", "fp32, bf16 (CUDA or CPU) or fp16 (CUDA only): autocast of the training and "
                                "evaluation passes.")
    max_train_examples: int | None = _f(None, "Use only the first N training rows of each task.")
    max_eval_examples: int | None = _f(None, "Use only the first N validation and test rows of each task.")
    data_dir: str = _f("../shared/data", "Folder of the datasets; ADALAYERS_DATA wins.")

    def specs(self) -> list[TaskSpec]:
        return self.tasks

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def validate(cfg: MultitaskConfig) -> list[str]:
    from adalayers.multitask.graph import order

    p = []
    names = [t.name for t in cfg.tasks]
    if not cfg.tasks:
        p.append("tasks: list at least one task")
    if len(set(names)) != len(names):
        p.append(f"tasks: a task is listed twice: {names}")
    for i, t in enumerate(cfg.tasks):
        if t.head not in HEADS:
            p.append(f"tasks[{i}].head: must be one of {', '.join(HEADS)}, got {t.head!r}")
        if t.weight < 0:
            p.append(f"tasks[{i}].weight: must be at least 0, got {t.weight}")
        if t.hidden < 1 or not 0 <= t.dropout < 1:
            p.append(f"tasks[{i}]: hidden must be at least 1 and dropout in [0, 1)")
        for d in t.depends_on:
            if d not in names:
                p.append(f"tasks[{i}].depends_on: {d!r} is not among the tasks {names}")
    if cfg.schedule not in SCHEDULES:
        p.append(f"schedule: must be one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}")
    if not (cfg.freeze in ("none", "all") or (cfg.freeze.startswith("top:") and cfg.freeze[4:].isdigit()
                                               and int(cfg.freeze[4:]) >= 1)):
        p.append(f"freeze: must be none, all or top:N (N >= 1), got {cfg.freeze!r}")
    for name in ("max_length", "batch_size", "eval_batch_size", "epochs"):
        if getattr(cfg, name) < 1:
            p.append(f"{name}: must be at least 1, got {getattr(cfg, name)}")
    if cfg.precision not in ("auto", "fp32", "bf16", "fp16"):
        p.append(f"precision: must be auto, fp32, bf16 or fp16, got {cfg.precision!r}")
    if cfg.smart.eps <= 0 or cfg.smart.steps < 0 or not 0 <= cfg.smart.beta < 1:
        p.append("smart: eps must be positive, steps at least 0, beta in [0, 1)")
    if not p:
        order(cfg.tasks)  # raises ConfigError naming a cycle
    return p


def from_dict(data: dict, overrides: list[str] | None = None) -> MultitaskConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"multitask config: the top level must be a mapping, got {type(data).__name__}")
    data = dict(data)
    problems: list[str] = []
    apply_overrides(data, overrides, problems, need_section=False,
                    example="field=value, e.g. epochs=1 or smart.enabled=true")
    raw_tasks = data.pop("tasks", [])
    cfg = _build(MultitaskConfig, data, "", problems)
    if not isinstance(raw_tasks, list):
        problems.append("tasks: expected a list of task mappings")
        raw_tasks = []
    cfg.tasks = [_build(TaskSpec, t, f"tasks[{i}].", problems) for i, t in enumerate(raw_tasks)]
    for i, t in enumerate(cfg.tasks):
        if not isinstance(t.depends_on, list):
            problems.append(f"tasks[{i}].depends_on: expected a list of task names")
            t.depends_on = []
    if not problems:
        problems += validate(cfg)
    if problems:
        raise ConfigError("invalid multi-task config:\n  - " + "\n  - ".join(problems))
    return cfg


def load(path, overrides: list[str] | None = None) -> MultitaskConfig:
    return load_yaml(path, from_dict, overrides)
