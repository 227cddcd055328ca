"""The search space of `adalayers tune`: config fields and the values a trial may give them.

A parameter is a config field ("section.field") with one of
    [a, b, c]                         a choice (Optuna's suggest_categorical)
    {low: L, high: H}                 a float range, or an int range when L and H are whole numbers
    {low: L, high: H, log: true}      a float range sampled on a log scale
    {low: L, high: H, step: S}        a range on a grid
    a single value                    fixed: set for every trial, not searched
    null                              take a default parameter out of the search

The YAML's `tune.space` is merged over DEFAULTS (and TOKEN_DEFAULTS for token heads). Only the
mixer, head and training settings may be searched: everything the hidden-state cache depends on
(the base, the data, max_length) stays fixed, so every trial trains from the same cache.
"""
from __future__ import annotations

from dataclasses import dataclass

from adalayers.errors import ConfigError
from adalayers.kinds import TaskKind

# The thesis tuned for RoBERTa-large; these ranges surround its settings for the small bases.
DEFAULTS: dict = {
    "mixer.k": [32, 64, 128],
    "mixer.alpha": {"low": 4.0, "high": 128.0, "log": True},
    "train.lr": {"low": 3.0e-5, "high": 3.0e-3, "log": True},
    "train.weight_decay": {"low": 1.0e-6, "high": 1.0e-1, "log": True},
    "mixer.dropout": {"low": 0.0, "high": 0.4},
    "head.dropout": {"low": 0.0, "high": 0.4},
    "mixer.cutoff": {"low": 0.0, "high": 0.05},
    "mixer.entropy_lambda": {"low": 1.0e-5, "high": 1.0e-1, "log": True},
    "head.num_heads": [1, 2, 4, 8],
    "head.pooling": ["mean", "max", "first"],
}
# token heads: no pooling; the encoder layers and their feed-forward width instead
TOKEN_DEFAULTS: dict = {
    "head.pooling": None,
    "head.encoder_layers": [1, 2],
    "head.dim_feedforward": [256, 512, 1024, 2048],
}
SEARCHABLE = ("mixer", "head", "train")
NOT_SEARCHABLE = {"mixer.pin_layer", "head.kind", "train.device", "train.num_threads", "train.max_epochs",
                  "train.eval_batch_size", "train.max_minutes", "train.precision"}


@dataclass(frozen=True)
class Param:
    name: str                      # "section.field"
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    integer: bool = False

    def suggest(self, trial):
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1))
        return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)


def _field_type(name: str):
    from adalayers.config import Config
    from adalayers.settings import fields_of

    section, _, fld = name.partition(".")
    if section not in SEARCHABLE or not fld or name in NOT_SEARCHABLE:
        raise ConfigError(f"tune.space.{name}: only mixer.*, head.* and train.* settings can be searched "
                          f"(not {', '.join(sorted(NOT_SEARCHABLE))}; the base, data and cache stay fixed)")
    hints = fields_of(fields_of(Config)[section])
    if fld not in hints:
        raise ConfigError(f"tune.space.{name}: {section} has no field {fld!r}")
    return hints[fld]


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse(name: str, spec) -> Param | None:
    """One entry of tune.space -> a Param (None: a fixed value, applied but not searched)."""
    tp = _field_type(name)
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"tune.space.{name}: an empty list of choices")
        if not all(v is None or isinstance(v, (str, int, float, bool)) for v in spec):
            raise ConfigError(f"tune.space.{name}: choices must be plain values, got {spec!r}")
        return Param(name, choices=tuple(spec))
    if isinstance(spec, dict):
        unknown = set(spec) - {"low", "high", "log", "step"}
        if unknown or not {"low", "high"} <= set(spec):
            raise ConfigError(f"tune.space.{name}: a range is {{low: L, high: H}} with optional log and step, "
                              f"got {spec!r}")
        low, high = (float(spec[k]) if isinstance(spec[k], str) else spec[k] for k in ("low", "high"))
        if not (_number(low) and _number(high)) or low >= high:
            raise ConfigError(f"tune.space.{name}: low must be a number below high, got {spec!r}")
        log, step = bool(spec.get("log", False)), spec.get("step")
        if log and low <= 0:
            raise ConfigError(f"tune.space.{name}: a log range needs low > 0, got {low}")
        if log and step is not None:
            raise ConfigError(f"tune.space.{name}: a range cannot have both log and step")
        wants_int = tp is int or (isinstance(low, int) and isinstance(high, int) and not log and tp is not float)
        return Param(name, low=low, high=high, log=log, step=step, integer=wants_int)
    return None


def merged(cfg) -> dict:
    """DEFAULTS (+ TOKEN_DEFAULTS for token heads) with the config's tune.space over them."""
    space = dict(DEFAULTS)
    if cfg.head.kind == TaskKind.TOKENS:
        space.update(TOKEN_DEFAULTS)
    space.update(cfg.tune.space or {})
    return space


def build(cfg) -> tuple[list[Param], dict]:
    """(searched parameters, fixed values) of the config's merged space; every entry checked here."""
    params, fixed = [], {}
    for name, spec in merged(cfg).items():
        if spec is None:
            continue
        p = parse(name, spec)
        if p is None:
            fixed[name] = spec
        else:
            params.append(p)
    return params, fixed


def apply(cfg, values: dict):
    """A new, validated Config: `cfg` with {'train.lr': 3e-4, ...} set (a ConfigError if they clash)."""
    from adalayers import config as config_mod

    data = cfg.to_dict()
    for name, value in values.items():
        section, _, fld = name.partition(".")
        data[section][fld] = value
    return config_mod.from_dict(data)
