"""Every setting of a run: one tree of pydantic models (adalayers.settings.Section), with defaults and help.

A YAML file fills them in, `--set section.field=value` overrides single fields, and every problem of
a config (a wrong type, a value out of range, an unknown field) is one line naming the field, all of
them in one ConfigError.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator

from adalayers import runtimes
from adalayers.errors import ConfigError
from adalayers.kinds import ALIASES as TASK_KINDS, TaskKind  # every name of a TaskKind -> the TaskKind
from adalayers.settings import (Section, apply_overrides, build, check, compare, load_yaml,
                                override_problems as _override_problems, raise_problems, setting)
from adalayers.config_files import (FILE_FORMATS, FILES_OPTIONS, FilesConfig,  # noqa: F401  (re-exported)
                                    nest_files as _nest_files, nest_overrides as _nest_overrides)

Fraction = Annotated[float, check(lambda v: 0 <= v < 1, "must be in [0, 1)")]
POOLINGS = ("mean", "max", "first", "last")
# Upper bounds on sizes a config (or a run folder's config.json) may ask for: far above any useful value,
# low enough that a typo or an edited file is a one-line error rather than gigabytes allocated.
MAX_SIZES = {"mixer.k": 8192, "head.num_heads": 256, "head.dim_feedforward": 65536, "head.encoder_layers": 48,
             "model.max_length": 131072}
MAX_ALPHA = 10_000.0


class TaskConfig(Section):
    name: str = setting("cola", "Dataset reader: a name from adalayers.data.tasks.TASKS (cola, stsb, imdb, "
                                "conll2003, ...), or 'files' for your own files (the default when task.train is set).")
    data_dir: str = setting("../shared/data", "Folder holding the datasets; the ADALAYERS_DATA environment "
                                              "variable wins.")
    files: FilesConfig = Field(default_factory=FilesConfig, description="Your own data (task 'files'); "
                               "its options may also be given flat in task (task.train is task.files.train).")
    metric: str | None = setting(None, "Validation metric that picks the best epoch (any task). None = the task's "
                                       "own; for 'files': macro_f1 (classification; or accuracy, mcc), pearson "
                                       "(regression; or spearman), f1 (tokens: entity F1).")
    positive_label: str | None = setting(None, "Binary classification: the label whose precision, recall and F1 "
                                               "are reported (positive_*). None = the second label: of the sorted "
                                               "values for your files, in label_names' order when given (CoLA: "
                                               "acceptable).")
    validation_fraction: Annotated[float, check(lambda v: 0 < v < 1, "must be in (0, 1)")] = setting(
        0.1, "Share of train held out (stratified) when the dataset has no validation split.")
    split_seed: int = setting(42, "Seed of that held-out split.")
    max_train_examples: int | None = setting(None, "Use only the first N training examples (after the split); "
                                                   "for quick tries.")
    skip_bad_rows: bool = setting(False, "Skip malformed rows of data files (counted and reported) instead of "
                                         "stopping.")
    max_eval_examples: int | None = setting(None, "Use only the first N validation and test examples; for quick "
                                                  "tries.")
    options: dict = setting({}, "Reader-specific options (see the task's module).")
    template: str | None = setting(None, "Wrap every input text before the base reads it, in training and "
                                         "prediction alike: 'chat' (the base tokenizer's chat template, the text "
                                         "as one user message) or a format string with {text} (and {text_pair} "
                                         "for sentence pairs), e.g. 'Review: {text}\\nSentiment:'. None = the text "
                                         "as given. Not for token tasks. See docs/llm.md.")
    add_generation_prompt: bool = setting(True, "task.template chat: end each text with the opening of the "
                                                "assistant's turn (apply_chat_template's add_generation_prompt), "
                                                "where a chat model starts its answer.")
    pair_separator: str | None = setting("\n", "Sentence pairs without task.template on a base whose tokenizer "
                                               "has no separator token of its own (decoders: Gemma's pair encoding "
                                               "puts a second BOS, with its outsized state, between the texts; Qwen's "
                                               "and GPT-2's nothing): the base reads text + this + text_pair as one "
                                               "text. None = the tokenizer's pair encoding as it is. Encoders ([SEP], "
                                               "</s>) always use their own pair encoding.")

    @model_validator(mode="before")
    @classmethod
    def _flat_files(cls, data):
        return _nest_files(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _files_task(self):
        problems = files_task_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self


def files_task_problems(t: TaskConfig) -> list[str]:
    """The checks that span task fields: the template, the options only task 'files' reads, its training
    file, its metric."""
    from adalayers.template_spec import spec_problem

    f = t.files
    own = [k for k in FILES_OPTIONS if getattr(f, k) != FilesConfig.model_fields[k].get_default(
        call_default_factory=True)]
    p = [f"task.template: {spec_problem(t.template)}"] if spec_problem(t.template) else []
    if t.name != "files":
        return p + ([f"task.files.{own[0]}: only read by task 'files' (your own data), but task.name is "
                     f"{t.name!r}"] if own else [])
    if not f.train:
        p.append("task.files.train: task 'files' needs a training file (or a saved Hugging Face dataset)")
    if f.label_names and TASK_KINDS.get(f.kind) in (TaskKind.REGRESSION, TaskKind.TOKENS):
        p.append("task.files.label_names: only for classification tasks")
    if t.metric is not None:
        from adalayers.metrics import MAIN_METRICS

        allowed = MAIN_METRICS[TASK_KINDS[f.kind]] if f.kind in TASK_KINDS else sorted(
            {m for ms in MAIN_METRICS.values() for m in ms})
        if t.metric not in allowed:
            p.append(f"task.metric: must be one of {', '.join(allowed)}, got {t.metric!r}")
    return p


def _trains(name: str) -> str:
    """model.runtime: a runtime of the registry that runs a base alone (adalayers.runtimes.names(trains=True))."""
    choices = runtimes.names(trains=True)
    if name not in choices:
        raise ValueError(f"must be {' or '.join(choices)}" if len(choices) <= 2 else
                         f"must be one of {', '.join(choices)}")
    return name


class ModelConfig(Section):
    base: str = setting("minilm-l6", "Frozen base: an alias (minilm-l6, mpnet-base, gemma3-270m, qwen2.5-0.5b), a "
                                     "local Hugging Face folder, a .gguf file (llama.cpp / Ollama; converted once), "
                                     "or a hub id.")
    max_length: int | None = setting(None, "Tokens per input; longer inputs are truncated (token tasks are split "
                                           "into windows). None = chosen from the training data: the length that "
                                           "holds 99% of its examples whole, at most the base's limit (printed, "
                                           "with the share cut).", ge=8, le=MAX_SIZES["model.max_length"])
    states: Literal["encoder", "decoder"] = setting("encoder", "For encoder-decoder bases: read 'encoder' or "
                                                               "'decoder' hidden states.")
    runtime: Annotated[str, AfterValidator(_trains)] = setting(
        "torch", "What runs the base for training and evaluation: a runtime of adalayers.runtimes that runs a base "
                 "alone: torch or llama.cpp (a GGUF base as it is, quantized, CPU).")


class MixerConfig(Section):
    k: int = setting(64, "Width of each layer's projection and of the mixed features F.", ge=1,
                     le=MAX_SIZES["mixer.k"])
    alpha: float = setting(64.0, "Layer weights are softmax(alpha * p); a larger alpha lets p move the weights "
                                 "faster.", gt=0, le=MAX_ALPHA)
    entropy_lambda: float = setting(0.0, "Weight of the entropy penalty on the layer weights (pushes towards few "
                                         "layers).")
    cutoff: Fraction = setting(0.01, "Layer weights at or below this are set to 0 and the rest renormalised.")
    dropout: Fraction = setting(0.03, "Dropout on the mixed features F.")
    projection_dropout: bool = setting(False, "Also apply dropout to each layer's projection before the sum "
                                              "(original code).")
    gelu_after_sum: bool = setting(False, "Apply GELU to F after the weighted sum (original code).")
    positional: bool = setting(True, "Add sinusoidal positional embeddings to F.")
    pin_layer: int | None = setting(None, "Use this layer only (0 = embedding output): the single-layer baseline.",
                                    ge=0)
    max_layer: int | None = setting(None, "Mix the states 0..max_layer only (None = all); leaving a decoder's final "
                                          "state out spares llama.cpp's prefill every output (docs/llm.md).", ge=0)
    layer_dropout: Fraction = setting(0.0, "Training only: drop each layer from the mix with this probability per "
                                           "batch and renormalise the kept weights (ELMo / UDify scalar-mix layer "
                                           "dropout); 0 = off.")
    logit_lr_scale: float = setting(1.0, "The mixing logits p learn at train.lr times this (the rest of the head at "
                                         "train.lr); 1 = one learning rate for everything.", gt=0)
    freeze_after: int | None = setting(None, "Training only: the mixing logits p stop learning after this many "
                                             "epochs (the layer weights stay as they were then; the projections "
                                             "and the head go on learning); None = they learn throughout.", ge=0,
                                       le=1_000_000)
    learn_after: int = setting(3, "Training only: the mixing logits p stay as initialised (the uniform mix, or "
                                  "mixer.init_layer's) for this many epochs, at most a third of "
                                  "train.max_epochs, while the projections and the head learn, then learn too: a "
                                  "step anneal of alpha from 0 (docs/results.md: level with the best single layer "
                                  "where learning from the start was not); 0 = they learn from the start (the "
                                  "old default).", ge=0, le=1_000_000)
    warmup_epochs: int = setting(0, "Training only: for this many epochs only the mixing logits p learn (the "
                                    "projections and the head stay as initialised), then everything learns: a "
                                    "mixer-only warm-up; 0 = off.", ge=0, le=1_000_000)
    init_layer: int | Literal["middle"] | None = setting(
        None, "Warm start: the layer weights start with mixer.init_share on this layer (0 = the embedding output; "
              "'middle' = layer (L-1)//2 of the L states) and the rest shared evenly, instead of uniform; None = "
              "uniform.")
    init_share: Fraction = setting(0.5, "The starting weight of mixer.init_layer (with it set).")
    holdout: Fraction = setting(0.0, "Training only: this share of the training rows (drawn with train.seed) "
                                     "teaches only the mixing logits p, and the rest everything else: "
                                     "first-order bilevel, as DARTS, so the layer weights follow held-out "
                                     "rows instead of the training loss; 0 = off.")
    holdout_pace: Literal["epoch", "step"] = setting(
        "epoch", "With mixer.holdout: 'epoch' = the mixing steps pass over the held-out rows once an epoch, "
                 "spread between the training steps; 'step' = a mixing step after every training step, the "
                 "held-out rows reshuffled whenever they run out.")


class HeadConfig(Section):
    kind: Literal[tuple(k.value for k in TaskKind)] | None = setting(
        None, "sequence (classification), regression, or token (classification per word). None = the task's kind.")
    num_heads: int = setting(8, "Attention heads in the head's self-attention / encoder layers.", ge=1,
                             le=MAX_SIZES["head.num_heads"])
    encoder_layers: int = setting(1, "Token head: pre-LayerNorm transformer encoder layers on F.", ge=1,
                                  le=MAX_SIZES["head.encoder_layers"])
    dim_feedforward: int = setting(2048, "Token head: feed-forward width of those encoder layers.", ge=1,
                                   le=MAX_SIZES["head.dim_feedforward"])
    dropout: Fraction = setting(0.03, "Dropout inside the head.")
    pooling: Literal[POOLINGS] = setting("mean", "Sequence / regression head: how the attended tokens become one "
                                                 "vector: mean (over the real tokens), max, first (the first token, "
                                                 "e.g. [CLS]) or last (the last real token: what probes of decoder "
                                                 "LLMs use, only it has read the whole text).")
    skip_bos: bool | None = setting(None, "Leave the BOS token a decoder's tokenizer puts before every text out of "
                                          "the head's attention and pooling (its state is the same for every text, "
                                          "and huge in Gemma). None = yes for decoder bases whose tokenizer "
                                          "prepends one.")
    attention_dropout: Fraction | None = setting(None, "Dropout on the head's attention weights (None = "
                                                       "head.dropout, as nn.MultiheadAttention does). On a CPU it "
                                                       "draws B*heads*T*T random numbers a step: at T=256 most of a "
                                                       "cached IMDB step; 0 skips it.")
    target_mean: float | None = setting(None, "Regression: the training targets' mean. The head predicts "
                                              "target_mean + target_std * output and its MSE is taken in those "
                                              "standard units, so an output layer that starts near 0 starts at "
                                              "the mean. None = filled in from the training data (a run saved "
                                              "without it uses 0 and 1).")
    target_std: float | None = setting(None, "Regression: the training targets' standard deviation (see "
                                             "target_mean).", gt=0)
    type: Literal["attention", "probe"] = setting(
        "attention", "attention: the head above (self-attention or encoder layers on the mixed features); probe: "
                     "a linear probe, one pooling and one linear map on one layer's features (the mixer pinned to "
                     "mixer.pin_layer with an identity projection, k = the base's width); `adalayers train` fits "
                     "one on every run (adalayers.recipes.probes) and may keep it (train.keep).")


# The fields every trainable config shares, each declared once as a type that carries its check and help:
# a config that wants another default re-annotates the field with the same type (`lr: LR = 3e-5`).
LR = Annotated[float, Field(gt=0, description="AdamW learning rate.")]  # the one learning-rate declaration
WeightDecay = Annotated[float, Field(ge=0, description="AdamW weight decay.")]
BatchSize = Annotated[int, Field(ge=1, description="Examples per step.")]
EvalBatchSize = Annotated[int, Field(ge=1, description="Examples per step when evaluating.")]
MaxEpochs = Annotated[int, Field(ge=1, description="Upper bound on epochs; the epoch with the best validation "
                                                   "metric is kept.")]
Precision = Annotated[Literal["auto", "fp32", "bf16", "fp16"], Field(
    description="auto (bf16 autocast on CUDA, fp32 on CPU), fp32, bf16 (CUDA or CPU) or fp16 (CUDA only).")]


class OptimSettings(Section):
    """The optimiser and training-loop fields every trainable config shares: the run config's train
    section and the lab's multi-task config extend it."""
    RENAMED = {"epochs": "max_epochs"}
    lr: LR = 1e-4
    weight_decay: WeightDecay = 0.0
    batch_size: BatchSize = 32
    eval_batch_size: EvalBatchSize = 128
    max_epochs: MaxEpochs = 30
    grad_clip: float = setting(1.0, "Clip the gradient norm to this (0 = off).", ge=0)
    seed: int = setting(0, "Seed for initialisation and batch order.")
    precision: Precision = "auto"


class TrainConfig(OptimSettings):
    lr_patience: int = setting(3, "Epochs without validation improvement before the learning rate is halved.")
    early_stopping: int = setting(8, "Epochs without validation improvement before training stops.")
    max_minutes: float | None = setting(None, "Stop before an epoch that would end past this many minutes of "
                                              "training (judged by the longest epoch so far; None = no limit).",
                                        gt=0)
    keep: Literal["head", "probe", "best"] = setting(
        "best", "What the run folder keeps: head (the trained head), probe (the best linear probe, fitted after the "
                "head on the same states) or best (the better of the two on validation; selection.md says which "
                "and why). Every run fits the probes and reports them in metrics.json.")
    time_budget: float | None = setting(None, "Minutes the whole run may take, cache build included: max_epochs (and "
                                              "if needed model.max_length) are chosen to fit, and said; None = no "
                                              "budget.", gt=0)
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto (CUDA when present), cpu or cuda.")
    num_threads: int | None = setting(None, "torch CPU threads (None = torch's default).")
    head_precision: Literal["bf16"] | None = setting(None, "bf16: the side task's own matrix products (the mixer's "
                                                           "projections, the heads' projections and feed-forward) "
                                                           "in bf16 while it trains, fp32 weights kept; the base "
                                                           "keeps `precision`, evaluation runs as without it. Pays "
                                                           "on CUDA or a CPU with AVX512-BF16/AMX. None = as "
                                                           "`precision`.")
    tensorboard: bool = setting(False, "Also write TensorBoard scalars per epoch to <run>/tensorboard (loss, "
                                       "metrics, learning rate, layer weights); needs pip install "
                                       "'adalayers[tensorboard]'.")


class CacheConfig(Section):
    enabled: bool = setting(True, "Cache the frozen base's hidden states on disk and train from them.")
    max_gb: float = setting(20.0, "Disk budget for one dataset's cache; over it, the base runs on the fly.", ge=0)
    dir: str | None = setting(None, "Cache folder; default $ADALAYERS_CACHE or ~/.cache/adalayers.")
    shard_mb: float = setting(256.0, "Size of one layer's file in one shard of the cache, in MB.", gt=0)


_BOUNDS = {"greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
           "less_than_equal": "must be at most {le}"}


def one_line(e: ValidationError, where=lambda loc: ".".join(str(x) for x in loc)) -> str:
    """A pydantic ValidationError as one line: 'WHERE: problem, got VALUE' (the first problem, and how
    many more there are); `where(loc)` names the place (a flag, a config field)."""
    err = e.errors()[0]
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in (err.get("ctx") or {}).items()}
    msg = _BOUNDS[err["type"]].format(**ctx) if err["type"] in _BOUNDS else err["msg"].removeprefix("Value error, ")
    got = f", got {err['input']!r}" if "input" in err and not isinstance(err["input"], (dict, list)) else ""
    more = f" (and {e.error_count() - 1} more problem(s))" if e.error_count() > 1 else ""
    place = where(err["loc"])
    return f"{place + ': ' if place else ''}{msg}{got}{more}"


class TuneConfig(Section):
    """Settings of `adalayers tune` (read by it only; a trained run ignores them)."""
    space: dict = setting({}, "Search space over config fields, merged over the defaults in adalayers.lab.tune.space: "
                              "'section.field: [a, b, c]' (a choice), '{low: L, high: H, log: true}' (a float range; "
                              "int when low and high are whole numbers and log is not set, 'step' allowed), a single "
                              "value (fixed), or null (take it out of the search).")
    max_epochs: int | None = setting(None, "Epochs per trial (None = train.max_epochs); early stopping and pruning "
                                           "still apply.", ge=1)
    seed: int = setting(0, "Seed of the TPE sampler.")
    startup_trials: int = setting(5, "Trials sampled at random, and never pruned, before TPE and the median pruner "
                                     "start.", ge=0)
    warmup_epochs: int = setting(2, "Epochs of a trial before the median pruner may stop it.", ge=0)


class Config(Section):
    task: TaskConfig = Field(default_factory=TaskConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    mixer: MixerConfig = Field(default_factory=MixerConfig)
    head: HeadConfig = Field(default_factory=HeadConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    tune: TuneConfig = Field(default_factory=TuneConfig)

    @model_validator(mode="after")
    def _fields_agree(self):
        if self.mixer.k % self.head.num_heads:
            raise ValueError(f"head.num_heads: must divide mixer.k ({self.mixer.k}), got {self.head.num_heads}")
        if isinstance(self.mixer.init_layer, int) and self.mixer.init_layer < 0:
            raise ValueError(f"mixer.init_layer: a layer number from 0 (the embedding output) or 'middle', got "
                             f"{self.mixer.init_layer}")
        if self.model.runtime == "llama.cpp" and self.train.device == "cuda":
            raise ValueError("train.device: model.runtime=llama.cpp runs the base on the CPU; use cpu or auto")
        if self.model.runtime == "llama.cpp" and self.train.precision in ("bf16", "fp16"):
            raise ValueError(f"train.precision: model.runtime=llama.cpp gives the states of its GGUF as they are "
                             f"(no autocast); use auto or fp32, got {self.train.precision!r}")
        return self

    def data_dir(self) -> Path:
        return Path(os.environ.get("ADALAYERS_DATA") or self.task.data_dir).expanduser()


# --- loading and checking -------------------------------------------------------------------

def override_problems(overrides: list[str] | None, cls=None) -> list[str]:
    """--set items that name no field of `cls` (default: a run's Config), each with the flag it came from
    and the closest field: "--set train.lrr=1e-3: no field train.lrr; did you mean train.lr?"."""
    return _override_problems(_nest_overrides(overrides), cls or Config, [f"task.{name}" for name in FILES_OPTIONS])


def check_overrides(overrides: list[str] | None, cls=None) -> None:
    """Raise one ConfigError for every --set item that names no field (see override_problems)."""
    raise_problems(override_problems(overrides, cls), "invalid --set")


def from_dict(data: dict, overrides: list[str] | None = None) -> Config:
    """Build and validate a Config from a plain dict plus `section.field=value` overrides."""
    if not isinstance(data or {}, dict):
        raise ConfigError(f"invalid config: the top level must be a mapping of sections, got {type(data).__name__}")
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in (data or {}).items()}
    overrides = _nest_overrides(overrides)
    check_overrides(overrides)  # a typo on the command line is the flag's, not the config file's
    problems: list[str] = []
    if isinstance(data.get("task"), dict):
        data["task"] = _nest_files(data["task"])
    apply_overrides(data, overrides, problems)
    task = data.get("task")
    files = task.get("files") if isinstance(task, dict) else None
    if isinstance(files, dict) and "name" not in task and (files.get("train") or files.get("format")):
        task["name"] = "files"  # giving your own files is enough to pick the generic reader
    cfg = build(Config, data, "", problems)
    raise_problems(problems, "invalid config")
    return cfg


def validate(cfg: Config) -> list[str]:
    """The problems of a Config built or changed in code, one line each (none: [])."""
    problems: list[str] = []
    build(Config, cfg.to_dict(), "", problems)
    return problems


_PATHS = {"task.data_dir", "task.files.train", "task.files.validation", "task.files.test"}


def differences(old: dict, new: dict, ignore: dict[str, set[str] | None] | None = None) -> list[str]:
    """The settings two config dicts disagree on, as 'section.field: OLD there, NEW now'.

    `old` is a stored config (a run's resume state, a finished run, a tuning study) possibly written
    by an older version: it is read through from_dict first, so a field added since holds its default
    and is no difference. `ignore` maps a section to the fields left out of the comparison (None: the
    whole section). A stored config this version cannot read is compared as it is. Paths to the data
    (task.data_dir, task.files.train, ...) are compared as the places they name from the current folder,
    so `../data` and the same folder's absolute path are no difference.
    """
    def read(d: dict) -> dict:
        try:
            return from_dict(d).to_dict()
        except ConfigError:
            return d

    return compare(read(old), read(new), ignore or {}, _PATHS, {"task.files"})


def load(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    check_overrides(overrides)  # named as the flag, before the file is read (not as the file's problem)
    return from_dict({}, overrides) if path is None else load_yaml(path, from_dict, overrides)
