"""Every setting of a run, as dataclasses with defaults and help text.

A YAML file fills them in, `--set section.field=value` overrides single fields,
and `validate()` collects every problem into one ConfigError.
"""
from __future__ import annotations

import dataclasses
import os
import types
import typing
from typing import Literal
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adalayers.errors import ConfigError
from adalayers.kinds import ALIASES as TASK_KINDS, TaskKind  # every name of a TaskKind -> the TaskKind


def _f(default, help: str, **kw):
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class TaskConfig:
    name: str = _f("cola", "Dataset reader: a name from adalayers.data.tasks.TASKS (cola, stsb, imdb, conll2003, ...), "
                           "or 'files' for your own files (the default when task.train is set).")
    data_dir: str = _f("../shared/data", "Folder holding the datasets; the ADALAYERS_DATA environment variable wins.")
    # --- your own data (task 'files', see adalayers/data/tasks/files.py) -------------------------------
    train: str | None = _f(None, "Your training data: a .csv, .tsv, .jsonl or CoNLL file, or a folder saved by a "
                                 "Hugging Face dataset's save_to_disk (or a hub name, with a network). Relative "
                                 "paths are read from the current folder.")
    validation: str | None = _f(None, "Validation file (hf: split name). None = a stratified validation_fraction "
                                      "of train.")
    test: str | None = _f(None, "Test file (hf: split name). None = no test split: only validation is reported.")
    format: str | None = _f(None, "csv, tsv (no quoting, as GLUE), jsonl, conll or hf. None = from train's "
                                  "extension (.csv .tsv .jsonl .conll; a folder = hf).")
    kind: str | None = _f(None, "classification, regression or tokens. None = guessed: CoNLL or lists of tags -> "
                                "tokens, numbers with decimals -> regression, anything else -> classification.")
    text: str | int | None = _f(None, "Column with the text: a header name / JSON key, or a 0-based number in a "
                                      "file without header. None = 'text' ('tokens' for token tasks; CoNLL: 0).")
    text_pair: str | int | None = _f(None, "Column with the second text of a sentence-pair task.")
    label: str | int | None = _f(None, "Column with the label (token tasks: the list of tags; CoNLL: the tag "
                                       "column's number). None = 'label' ('tags' for token tasks; CoNLL: -1, last).")
    header: bool | None = _f(None, "CSV/TSV: the first row names the columns. None = yes when text/label are "
                                   "names, no when they are numbers.")
    label_names: dict = _f({}, "Rename label values and fix their order, e.g. {0: negative, 1: positive}; "
                               "every label value must be listed. Empty = the values, sorted.")
    tag_scheme: str = _f("iob2", "Token tags: iob2 (used as they are) or iob1 (converted to IOB2, e.g. the "
                                 "original CoNLL-2003 files).")
    metric: str | None = _f(None, "Validation metric that picks the best epoch (any task). None = the task's own; "
                                  "for 'files': macro_f1 (classification; or accuracy, mcc), pearson (regression; "
                                  "or spearman), f1 (tokens: entity F1).")
    positive_label: str | None = _f(None, "Binary classification: the label whose precision, recall and F1 are "
                                          "reported (positive_*). None = the second label: of the sorted values "
                                          "for your files, in label_names' order when given (CoLA: acceptable).")
    validation_fraction: float = _f(0.1, "Share of train held out (stratified) when the dataset has no validation split.")
    split_seed: int = _f(42, "Seed of that held-out split.")
    max_train_examples: int | None = _f(None, "Use only the first N training examples (after the split); for quick tries.")
    skip_bad_rows: bool = _f(False, "Skip malformed rows of data files (counted and reported) instead of stopping.")
    max_eval_examples: int | None = _f(None, "Use only the first N validation and test examples; for quick tries.")
    options: dict = _f({}, "Reader-specific options (see the task's module).")
    template: str | None = _f(None, "Wrap every input text before the base reads it, in training and prediction "
                                    "alike: 'chat' (the base tokenizer's chat template, the text as one user "
                                    "message) or a format string with {text} (and {text_pair} for sentence pairs), "
                                    "e.g. 'Review: {text}\\nSentiment:'. None = the text as given. Not for token "
                                    "tasks. See docs/llm.md.")
    add_generation_prompt: bool = _f(True, "task.template chat: end each text with the opening of the assistant's "
                                           "turn (apply_chat_template's add_generation_prompt), where a chat model "
                                           "starts its answer.")


@dataclass
class ModelConfig:
    base: str = _f("minilm-l6", "Frozen base: an alias (minilm-l6, mpnet-base, gemma3-270m, qwen2.5-0.5b), a local "
                                "Hugging Face folder, a .gguf file (llama.cpp / Ollama; converted once), or a hub id.")
    max_length: int | None = _f(None, "Tokens per input; longer inputs are truncated (token tasks are split into "
                                      "windows). None = chosen from the training data: the length that holds 99% "
                                      "of its examples whole, at most the base's limit (printed, with the share "
                                      "cut).")
    states: str = _f("encoder", "For encoder-decoder bases: read 'encoder' or 'decoder' hidden states.")


@dataclass
class MixerConfig:
    k: int = _f(64, "Width of each layer's projection and of the mixed features F.")
    alpha: float = _f(64.0, "Layer weights are softmax(alpha * p); a larger alpha lets p move the weights faster.")
    entropy_lambda: float = _f(0.0, "Weight of the entropy penalty on the layer weights (pushes towards few layers).")
    cutoff: float = _f(0.01, "Layer weights at or below this are set to 0 and the rest renormalised.")
    dropout: float = _f(0.03, "Dropout on the mixed features F.")
    projection_dropout: bool = _f(False, "Also apply dropout to each layer's projection before the sum (original code).")
    gelu_after_sum: bool = _f(False, "Apply GELU to F after the weighted sum (original code).")
    positional: bool = _f(True, "Add sinusoidal positional embeddings to F.")
    pin_layer: int | None = _f(None, "Use this layer only (0 = embedding output): the single-layer baseline.")
    layer_dropout: float = _f(0.0, "Training only: drop each layer from the mix with this probability per batch and "
                                   "renormalise the kept weights (ELMo / UDify scalar-mix layer dropout); 0 = off.")
    logit_lr_scale: float = _f(1.0, "The mixing logits p learn at train.lr times this (the rest of the head at "
                                    "train.lr); 1 = one learning rate for everything.")


@dataclass
class HeadConfig:
    kind: str | None = _f(None, "sequence (classification), regression, or token (classification per word). "
                                "None = the task's kind.")
    num_heads: int = _f(8, "Attention heads in the head's self-attention / encoder layers.")
    encoder_layers: int = _f(1, "Token head: pre-LayerNorm transformer encoder layers on F.")
    dim_feedforward: int = _f(2048, "Token head: feed-forward width of those encoder layers.")
    dropout: float = _f(0.03, "Dropout inside the head.")
    pooling: str = _f("mean", "Sequence / regression head: how the attended tokens become one vector: mean (over "
                              "the real tokens), max, first (the first token, e.g. [CLS]) or last (the last real "
                              "token: what probes of decoder LLMs use, only it has read the whole text).")
    skip_bos: bool | None = _f(None, "Leave the BOS token a decoder's tokenizer puts before every text out of the "
                                     "head's attention and pooling (its state is the same for every text, and huge "
                                     "in Gemma). None = yes for decoder bases whose tokenizer prepends one.")
    attention_dropout: float | None = _f(None, "Dropout on the head's attention weights (None = head.dropout, as "
                                                "nn.MultiheadAttention does). On a CPU it draws B*heads*T*T random "
                                                "numbers a step: at T=256 most of a cached IMDB step; 0 skips it.")
    target_mean: float | None = _f(None, "Regression: the training targets' mean. The head predicts target_mean + "
                                         "target_std * output and its MSE is taken in those standard units, so an "
                                         "output layer that starts near 0 starts at the mean. None = filled in from "
                                         "the training data (a run saved without it uses 0 and 1).")
    target_std: float | None = _f(None, "Regression: the training targets' standard deviation (see target_mean).")


@dataclass
class OptimSettings:
    """The optimiser and training-loop fields every trainable config shares, declared once: the run
    config's train section and the multi-task config extend it (with_defaults changes a default)."""
    RENAMED: typing.ClassVar[dict] = {"epochs": "max_epochs"}  # old name -> its name now (an error names both)
    lr: float = _f(1e-4, "AdamW learning rate.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    batch_size: int = _f(32, "Examples per step.")
    eval_batch_size: int = _f(128, "Examples per step when evaluating.")
    max_epochs: int = _f(30, "Upper bound on epochs; the epoch with the best validation metric is kept.")
    grad_clip: float = _f(1.0, "Clip the gradient norm to this (0 = off).")
    seed: int = _f(0, "Seed for initialisation and batch order.")
    precision: str = _f("auto", "auto (bf16 autocast on CUDA, fp32 on CPU), fp32, bf16 (CUDA or CPU) "
                                "or fp16 (CUDA only).")


def with_defaults(**defaults):
    """Class decorator (under @dataclass): inherited fields with other defaults, their type and help kept."""
    def apply(cls):
        hints = {}
        for klass in reversed(cls.__mro__[1:]):
            hints.update(getattr(klass, "__annotations__", {}))
        known = {f.name: f for klass in cls.__mro__[1:] if dataclasses.is_dataclass(klass)
                 for f in dataclasses.fields(klass)}
        cls.__annotations__ = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in defaults.items():
            cls.__annotations__[name] = hints[name]
            setattr(cls, name, _f(value, known[name].metadata["help"]))
        return cls
    return apply


def validate_optim(o: OptimSettings, where: str = "") -> list[str]:
    """The checks of the shared fields (`where`: 'train.' in a run config, '' in a multi-task config)."""
    p = []
    if o.precision not in ("auto", "fp32", "fp16", "bf16"):
        p.append(f"{where}precision: must be auto, fp32, fp16 or bf16, got {o.precision!r}")
    for name in ("batch_size", "eval_batch_size", "max_epochs"):
        if getattr(o, name) < 1:
            p.append(f"{where}{name}: must be at least 1, got {getattr(o, name)}")
    if o.lr <= 0:
        p.append(f"{where}lr: must be positive, got {o.lr}")
    if o.weight_decay < 0 or o.grad_clip < 0:
        p.append(f"{where}weight_decay / {where}grad_clip: must be >= 0, got {o.weight_decay} / {o.grad_clip}")
    return p


@dataclass
class TrainConfig(OptimSettings):
    lr_patience: int = _f(3, "Epochs without validation improvement before the learning rate is halved.")
    early_stopping: int = _f(8, "Epochs without validation improvement before training stops.")
    max_minutes: float | None = _f(None, "Stop before an epoch that would end past this many minutes of training "
                                         "(judged by the longest epoch so far; None = no limit).")
    device: str = _f("auto", "auto (CUDA when present), cpu or cuda.")
    num_threads: int | None = _f(None, "torch CPU threads (None = torch's default).")
    head_precision: str | None = _f(None, "bf16: the side task's own matrix products (the mixer's projections, the "
                                          "heads' projections and feed-forward) in bf16 while it trains, fp32 "
                                          "weights kept; the base keeps `precision`, evaluation runs as without it. "
                                          "Pays on CUDA or a CPU with AVX512-BF16/AMX. None = as `precision`.")
    tensorboard: bool = _f(False, "Also write TensorBoard scalars per epoch to <run>/tensorboard (loss, metrics, "
                                  "learning rate, layer weights); needs pip install 'adalayers[tensorboard]'.")


@dataclass
class CacheConfig:
    enabled: bool = _f(True, "Cache the frozen base's hidden states on disk and train from them.")
    max_gb: float = _f(20.0, "Disk budget for one dataset's cache; over it, the base runs on the fly.")
    dir: str | None = _f(None, "Cache folder; default $ADALAYERS_CACHE or ~/.cache/adalayers.")
    shard_mb: float = _f(256.0, "Size of one layer's file in one shard of the cache, in MB.")


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


@dataclass
class TuneConfig:
    """Settings of `adalayers tune` (read by it only; a trained run ignores them)."""
    space: dict = _f({}, "Search space over config fields, merged over the defaults in adalayers.lab.tune.space: "
                         "'section.field: [a, b, c]' (a choice), '{low: L, high: H, log: true}' (a float range; "
                         "int when low and high are whole numbers and log is not set, 'step' allowed), a single "
                         "value (fixed), or null (take it out of the search).")
    max_epochs: int | None = _f(None, "Epochs per trial (None = train.max_epochs); early stopping and pruning still apply.")
    seed: int = _f(0, "Seed of the TPE sampler.")
    startup_trials: int = _f(5, "Trials sampled at random, and never pruned, before TPE and the median pruner start.")
    warmup_epochs: int = _f(2, "Epochs of a trial before the median pruner may stop it.")


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    mixer: MixerConfig = field(default_factory=MixerConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def data_dir(self) -> Path:
        return Path(os.environ.get("ADALAYERS_DATA") or self.task.data_dir).expanduser()


# --- loading and checking -------------------------------------------------------------------

def _type_ok(value, tp) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, tp)


def _build(cls, data, where: str, problems: list[str]):
    if not isinstance(data, dict):
        problems.append(f"{where.rstrip('.') or 'config'}: expected a mapping, got {type(data).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    renamed = getattr(cls, "RENAMED", {})
    for key in data:
        if key in renamed and renamed[key] in names:
            problems.append(f"{where}{key}: renamed to {where}{renamed[key]}; rename it in your config")
        elif key not in names:
            problems.append(f"{where}{key}: unknown field{_did_you_mean(key, names, where)} "
                            f"(known: {', '.join(sorted(names))})")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        tp, value = hints[f.name], _yaml_float(data[f.name], hints[f.name])
        if dataclasses.is_dataclass(tp):
            values[f.name] = _build(tp, value, f"{where}{f.name}.", problems)
        elif _type_ok(value, tp):
            values[f.name] = float(value) if tp is float else value
        else:
            problems.append(f"{where}{f.name}: expected {getattr(tp, '__name__', tp)}, got {value!r}")
    return cls(**values)


def _did_you_mean(key: str, names, where: str = "") -> str:
    """'; did you mean train.lr?' for the closest name (difflib), or '' when none is close."""
    import difflib

    close = difflib.get_close_matches(str(key), sorted(names), n=1, cutoff=0.6)
    return f"; did you mean {where}{close[0]}?" if close else ""


def _field_paths(cls, where: str = "") -> dict[str, type]:
    """Every 'section.field' of a config class, to its type (sections too)."""
    out = {}
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        out[where + f.name] = tp
        if dataclasses.is_dataclass(tp):
            out.update(_field_paths(tp, f"{where}{f.name}."))
    return out


def override_problems(overrides: list[str] | None, cls=None) -> list[str]:
    """--set items that name no field of `cls` (default: a run's Config), each with the flag it came from
    and the closest field: "--set train.lrr=1e-3: no field train.lrr; did you mean train.lr?"."""
    paths = _field_paths(cls or Config)
    problems = []
    for item in overrides or []:
        key = item.partition("=")[0].strip()
        *sections, name = key.split(".")
        parent = ".".join(sections)
        renamed = getattr(paths.get(parent), "RENAMED", {}) if parent else {}
        if "=" not in item or "." not in key or key in paths:
            continue  # malformed items are reported by apply_overrides
        if any(paths.get(".".join(sections[:i])) is dict for i in range(1, len(sections) + 1)):
            continue  # a key inside a free-form mapping (task.options.x, tune.space.train.lr)
        if name in renamed:
            problems.append(f"--set {item}: {key} is renamed to {parent}.{renamed[name]}")
            continue
        known = [p for p in paths if p.count(".") == key.count(".")]
        problems.append(f"--set {item}: no field {key}{_did_you_mean(key, known)}")
    return problems


def check_overrides(overrides: list[str] | None, cls=None) -> None:
    """Raise one ConfigError for every --set item that names no field (see override_problems)."""
    problems = override_problems(overrides, cls)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError("invalid --set:\n  - " + "\n  - ".join(problems))


def _yaml_float(value, tp):
    """YAML reads 1e-4 (no dot) as a string; accept it where a float is expected."""
    if isinstance(value, str) and float in (typing.get_args(tp) or (tp,)):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _parse_scalar(text: str):
    """An override's value as YAML reads it; text YAML refuses (e.g. control characters) stays a string."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict, overrides: list[str] | None, problems: list[str], need_section: bool = True,
                    example: str = "section.field=value, e.g. train.lr=3e-4") -> None:
    """Put `a.b.c=value` overrides (value read as YAML) into the nested dict `data`; problems are collected.

    The one --set parser, for every config kind (run configs need a section, multi-task configs do not).
    """
    for item in overrides or []:
        key, eq, value = item.partition("=")
        if not eq or (need_section and "." not in key):
            problems.append(f"--set {item!r}: expected {example}")
            continue
        *sections, name = key.strip().split(".")
        node = data
        for i, section in enumerate(sections):
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                problems.append(f"--set {item!r}: {'.'.join(sections[:i + 1])} is not a section")
                break
        else:
            node[name] = _parse_scalar(value)


def from_dict(data: dict, overrides: list[str] | None = None) -> Config:
    """Build and validate a Config from a plain dict plus `section.field=value` overrides."""
    if not isinstance(data or {}, dict):
        raise ConfigError(f"invalid config: the top level must be a mapping of sections, got {type(data).__name__}")
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in (data or {}).items()}
    check_overrides(overrides)  # a typo on the command line is the flag's, not the config file's
    problems: list[str] = []
    apply_overrides(data, overrides, problems)
    task = data.get("task")
    if isinstance(task, dict) and "name" not in task and ("train" in task or "format" in task):
        task["name"] = "files"  # giving your own files is enough to pick the generic reader
    cfg = _build(Config, data, "", problems)
    # A field that failed its type check holds its default now; leave out value checks that mention
    # it, so every remaining problem is reported in this one pass and none speaks of a default.
    broken = {p.split(":", 1)[0] for p in problems}
    problems += [p for p in validate(cfg) if not any(b in p for b in broken)]
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
    return cfg


_PATHS = {("task", "data_dir"), ("task", "train"), ("task", "validation"), ("task", "test")}


def _same(section: str, key: str, a, b) -> bool:
    if a == b:
        return True
    if (section, key) in _PATHS and isinstance(a, str) and isinstance(b, str):
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()  # one place, spelled twice
    return False


def differences(old: dict, new: dict, ignore: dict[str, set[str] | None] | None = None) -> list[str]:
    """The settings two config dicts disagree on, as 'section.field: OLD there, NEW now'.

    `old` is a stored config (a run's resume state, a finished run, a tuning study) possibly written
    by an older version: it is read through from_dict first, so a field added since holds its default
    and is no difference. `ignore` maps a section to the fields left out of the comparison (None: the
    whole section). A stored config this version cannot read is compared as it is. Paths to the data
    (task.data_dir, task.train, ...) are compared as the places they name from the current folder, so
    `../data` and the same folder's absolute path are no difference.
    """
    ignore = ignore or {}
    try:
        old = from_dict(old).to_dict()
    except ConfigError:
        pass
    try:
        new = from_dict(new).to_dict()
    except ConfigError:
        pass
    diffs = []
    for section in sorted(set(old) | set(new)):
        left_out = ignore.get(section, set())
        if left_out is None:
            continue
        a, b = old.get(section) or {}, new.get(section) or {}
        if not isinstance(a, dict) or not isinstance(b, dict):
            if a != b:
                diffs.append(f"{section}: {a!r} there, {b!r} now")
            continue
        for key in sorted(set(a) | set(b)):
            if key not in left_out and not _same(section, key, a.get(key), b.get(key)):
                diffs.append(f"{section}.{key}: {a.get(key, '(absent)')!r} there, {b.get(key, '(absent)')!r} now")
    return diffs


def load_yaml(path: str | Path, build, overrides: list[str] | None = None):
    """Read a YAML config file and `build(data, overrides)` it; every error names the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        return build(data, overrides)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def load(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    check_overrides(overrides)  # named as the flag, before the file is read (not as the file's problem)
    return from_dict({}, overrides) if path is None else load_yaml(path, from_dict, overrides)


def validate(cfg: Config) -> list[str]:
    p = []
    if cfg.head.kind not in (None, *TaskKind):
        p.append(f"head.kind: must be sequence, regression or token, got {cfg.head.kind!r}")
    if cfg.model.states not in ("encoder", "decoder"):
        p.append(f"model.states: must be encoder or decoder, got {cfg.model.states!r}")
    p += validate_optim(cfg.train, "train.")
    if cfg.train.head_precision not in (None, "bf16"):
        p.append(f"train.head_precision: must be null or bf16, got {cfg.train.head_precision!r}")
    if cfg.train.device not in ("auto", "cpu", "cuda"):
        p.append(f"train.device: must be auto, cpu or cuda, got {cfg.train.device!r}")
    for name, value in [("mixer.k", cfg.mixer.k), ("head.num_heads", cfg.head.num_heads),
                        ("head.dim_feedforward", cfg.head.dim_feedforward),
                        ("model.max_length", cfg.model.max_length or 8), ("head.encoder_layers", cfg.head.encoder_layers)]:
        if value < 1:
            p.append(f"{name}: must be at least 1, got {value}")
    if cfg.mixer.k >= 1 and cfg.head.num_heads >= 1 and cfg.mixer.k % cfg.head.num_heads:
        p.append(f"head.num_heads: must divide mixer.k ({cfg.mixer.k}), got {cfg.head.num_heads}")
    if cfg.model.max_length is not None and cfg.model.max_length < 8:
        p.append(f"model.max_length: must be at least 8, got {cfg.model.max_length}")
    for name, value in [("mixer.dropout", cfg.mixer.dropout), ("head.dropout", cfg.head.dropout),
                        ("head.attention_dropout", cfg.head.attention_dropout or 0.0), ("mixer.cutoff", cfg.mixer.cutoff)]:
        if not 0 <= value < 1:
            p.append(f"{name}: must be in [0, 1), got {value}")
    if cfg.head.target_std is not None and not cfg.head.target_std > 0:
        p.append(f"head.target_std: must be positive, got {cfg.head.target_std}")
    if not 0 < cfg.task.validation_fraction < 1:
        p.append(f"task.validation_fraction: must be in (0, 1), got {cfg.task.validation_fraction}")
    p += _validate_files_task(cfg.task)
    if cfg.train.max_minutes is not None and cfg.train.max_minutes <= 0:
        p.append(f"train.max_minutes: must be positive (or null for no limit), got {cfg.train.max_minutes}")
    if cfg.cache.max_gb < 0 or cfg.cache.shard_mb <= 0:
        p.append(f"cache.max_gb / cache.shard_mb: must be >= 0 / > 0, got {cfg.cache.max_gb} / {cfg.cache.shard_mb}")
    from adalayers.template_spec import spec_problem

    if spec_problem(cfg.task.template):
        p.append(f"task.template: {spec_problem(cfg.task.template)}")
    if cfg.head.pooling not in POOLINGS:
        p.append(f"head.pooling: must be {', '.join(POOLINGS)}, got {cfg.head.pooling!r}")
    if cfg.tune.max_epochs is not None and cfg.tune.max_epochs < 1:
        p.append(f"tune.max_epochs: must be at least 1 (or null for train.max_epochs), got {cfg.tune.max_epochs}")
    if cfg.tune.startup_trials < 0 or cfg.tune.warmup_epochs < 0:
        p.append(f"tune.startup_trials / tune.warmup_epochs: must be >= 0, got "
                 f"{cfg.tune.startup_trials} / {cfg.tune.warmup_epochs}")
    if cfg.mixer.pin_layer is not None and cfg.mixer.pin_layer < 0:
        p.append(f"mixer.pin_layer: must be a layer number >= 0, got {cfg.mixer.pin_layer}")
    if not 0 <= cfg.mixer.layer_dropout < 1:
        p.append(f"mixer.layer_dropout: must be in [0, 1), got {cfg.mixer.layer_dropout}")
    if not cfg.mixer.logit_lr_scale > 0:
        p.append(f"mixer.logit_lr_scale: must be positive, got {cfg.mixer.logit_lr_scale}")
    return p + _validate_sizes(cfg)


# Upper bounds on sizes a config (or a run folder's config.json) may ask for: far above any useful value,
# low enough that a typo or an edited file is a one-line error rather than gigabytes allocated.
MAX_SIZES = {"mixer.k": 8192, "head.num_heads": 256, "head.dim_feedforward": 65536, "head.encoder_layers": 48,
             "model.max_length": 131072}
MAX_ALPHA = 10_000.0


def _validate_sizes(cfg: Config) -> list[str]:
    """Every float finite; the sizes above their MAX_SIZES bound; mixer.alpha in (0, MAX_ALPHA]."""
    import math

    p = []
    for section in dataclasses.fields(cfg):
        part = getattr(cfg, section.name)
        for f in dataclasses.fields(part) if dataclasses.is_dataclass(part) else ():
            value = getattr(part, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                p.append(f"{section.name}.{f.name}: must be a finite number, got {value}")
    for name, most in MAX_SIZES.items():
        section, key = name.split(".")
        value = getattr(getattr(cfg, section), key)
        if isinstance(value, int) and value > most:
            p.append(f"{name}: must be at most {most}, got {value}")
    alpha = cfg.mixer.alpha
    if math.isfinite(alpha) and not 0 < alpha <= MAX_ALPHA:
        p.append(f"mixer.alpha: must be in (0, {MAX_ALPHA:g}], got {alpha}")
    return p


POOLINGS = ("mean", "max", "first", "last")
FILE_FORMATS = ("csv", "tsv", "jsonl", "conll", "hf")


def _validate_files_task(t: TaskConfig) -> list[str]:
    p = []
    own = [f for f in ("train", "validation", "test", "format", "kind", "text", "text_pair", "label", "header")
           if getattr(t, f) is not None] + (["label_names"] if t.label_names else [])
    if t.name != "files":
        if own:
            p.append(f"task.{own[0]}: only read by task 'files' (your own data), but task.name is {t.name!r}")
        return p
    if not t.train:
        p.append("task.train: task 'files' needs a training file (or a saved Hugging Face dataset)")
    if t.format is not None and t.format not in FILE_FORMATS:
        p.append(f"task.format: must be one of {', '.join(FILE_FORMATS)}, got {t.format!r}")
    if t.kind is not None and t.kind not in TASK_KINDS:
        p.append(f"task.kind: must be classification, regression or tokens, got {t.kind!r}")
    if t.tag_scheme not in ("iob1", "iob2"):
        p.append(f"task.tag_scheme: must be iob1 or iob2, got {t.tag_scheme!r}")
    if t.label_names and TASK_KINDS.get(t.kind) in (TaskKind.REGRESSION, TaskKind.TOKENS):
        p.append("task.label_names: only for classification tasks")
    if t.metric is not None:
        from adalayers.metrics import MAIN_METRICS

        allowed = MAIN_METRICS[TASK_KINDS[t.kind]] if t.kind in TASK_KINDS else sorted(
            {m for ms in MAIN_METRICS.values() for m in ms})
        if t.metric not in allowed:
            p.append(f"task.metric: must be one of {', '.join(allowed)}, got {t.metric!r}")
    return p
