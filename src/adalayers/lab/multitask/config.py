"""The settings of a multi-task run: the tasks, the shared base, the trainer and its add-ons."""
from __future__ import annotations

from pydantic import Field

from adalayers.config import LR, BatchSize, EvalBatchSize, MaxEpochs, OptimSettings, Precision, WeightDecay
from adalayers.errors import ConfigError
from adalayers.settings import Section, apply_overrides, build, load_yaml
from adalayers.settings import setting as _f

HEADS = ("sentiment", "bilinear", "cosine", "linear")
SCHEDULES = ("round_robin", "proportional")


class TaskSpec(Section):
    name: str = _f("sst5", "A task from adalayers.data.tasks (sst5, sst2, qqp, stsb, cola, ...).")
    head: str = _f("linear", "sentiment (linear-GELU-dropout-linear), bilinear (paraphrase: (W1 y1+b1)^T(W2 y2+b2), "
                             "BCE; bi-encoder), cosine (similarity: 5 relu(cos(W1 y1+b1, W2 y2+b2)), MSE; "
                             "bi-encoder), linear (one layer; a pair task reads the cross-encoder input).")
    weight: float = _f(1.0, "This task's loss weight.")
    depends_on: list = _f([], "Tasks whose head outputs this head also reads (progressive sharing).")
    hidden: int = _f(256, "Hidden width of the sentiment head / projection width of bilinear and cosine heads.")
    dropout: float = _f(0.1, "Dropout inside the head.")
    max_train_examples: int | None = _f(None, "Use only the first N training rows of this task (default: the "
                                              "run's max_train_examples), e.g. a subset of QQP beside SST-5 in full.")


class SmartConfig(Section):
    enabled: bool = _f(False, "Add SMART's smoothness regulariser and Bregman proximal term.")
    eps: float = _f(1e-3, "Radius of the infinity-norm ball around the input embeddings.")
    sigma: float = _f(1e-5, "Std of the random start of the perturbation.")
    steps: int = _f(1, "Ascent steps on the perturbation.")
    step_size: float = _f(1e-3, "Ascent step (times the sign of the gradient).")
    lambda_s: float = _f(1.0, "Weight of the smoothness term.")
    mu: float = _f(1.0, "Weight of the Bregman proximal term (0 = off).")
    beta: float = _f(0.99, "Momentum of the EMA copy of the parameters.")


class MultitaskConfig(OptimSettings):
    """The shared optimiser fields (adalayers.config.OptimSettings: lr is the base's, max_epochs keeps the
    epoch with the best mean validation metric over the tasks) with a multi-task run's defaults, then these."""
    lr: LR = 3e-5
    weight_decay: WeightDecay = 0.01
    batch_size: BatchSize = 16
    eval_batch_size: EvalBatchSize = 64
    max_epochs: MaxEpochs = 2
    precision: Precision = "fp32"
    tasks: list = _f([], "The tasks: a list of TaskSpec mappings.")
    base: str = _f("minilm-l6", "Shared base model (alias or folder).")
    max_length: int = _f(64, "Tokens per input (a cross-encoder pair shares them).")
    freeze: str = _f("none", "none (fine-tune every layer), top:N (train only the last N layers), all (frozen).")
    schedule: str = _f("round_robin", "round_robin or proportional (MT-DNN: every batch once, in random order).")
    pcgrad: bool = _f(False, "Gradient surgery on the shared parameters (a step = one batch of every task).")
    freeze_upstream: bool = _f(True, "Upstream heads get no gradient from a downstream task's loss.")
    smart: SmartConfig = Field(default_factory=SmartConfig, description="SMART regularisation.")
    head_lr: LR = _f(1e-3, "AdamW learning rate of the heads.")
    max_train_examples: int | None = _f(None, "Use only the first N training rows of each task.")
    max_eval_examples: int | None = _f(None, "Use only the first N validation and test rows of each task.")
    data_dir: str = _f("../shared/data", "Folder of the datasets; ADALAYERS_DATA wins.")
    device: str = _f("auto", "auto (CUDA when present, else CPU), cpu or cuda.")

    def specs(self) -> list[TaskSpec]:
        return self.tasks

    def train_rows(self, task: str) -> int | None:
        """The training rows a task uses: its own max_train_examples, else the run's (None: all)."""
        own = next(s.max_train_examples for s in self.tasks if s.name == task)
        return self.max_train_examples if own is None else own


def validate(cfg: MultitaskConfig) -> list[str]:
    from adalayers.lab.multitask.graph import order

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
        if t.max_train_examples is not None and t.max_train_examples < 1:
            p.append(f"tasks[{i}].max_train_examples: must be at least 1 (or null: the run's), got {t.max_train_examples}")
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
    if cfg.device not in ("auto", "cpu", "cuda"):
        p.append(f"device: must be auto, cpu or cuda, got {cfg.device!r}")
    if cfg.max_length < 1:
        p.append(f"max_length: must be at least 1, got {cfg.max_length}")
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
                    example="field=value, e.g. max_epochs=1 or smart.enabled=true")
    raw_tasks = data.pop("tasks", [])
    cfg = build(MultitaskConfig, data, "", problems)
    if not isinstance(raw_tasks, list):
        problems.append("tasks: expected a list of task mappings")
        raw_tasks = []
    cfg.tasks = [build(TaskSpec, t, f"tasks[{i}].", problems) for i, t in enumerate(raw_tasks)]
    for i, t in enumerate(cfg.tasks):
        if not isinstance(t.depends_on, list):
            problems.append(f"tasks[{i}].depends_on: expected a list of task names")
            t.depends_on = []
    if not problems:
        problems += validate(cfg)
    if problems:
        raise ConfigError("invalid multi-task config:\n  - " + "\n  - ".join(problems))
    return cfg


def stored(data: dict) -> dict:
    """A multi-task config as a stored result holds it, in today's names (results written before `epochs`
    was renamed max_epochs keep being reused; a user's config with the old name is refused instead)."""
    data = dict(data)
    for old, new in OptimSettings.RENAMED.items():
        if old in data and new not in data:
            data[new] = data.pop(old)
    return data


def load(path, overrides: list[str] | None = None) -> MultitaskConfig:
    return load_yaml(path, from_dict, overrides)
