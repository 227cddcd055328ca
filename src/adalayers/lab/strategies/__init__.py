"""Ways to add a side task to a base model, each registered by name (one line per strategy).

A spec is `name` or `name:N` (single-layer:3, finetune-top:3); N fills the strategy's `arg_field`.
Per-strategy settings come from its config section (a Section of the one config tree, checked as the run
config is), overridable as `field=value` (read as the run config's --set is: adalayers.settings.apply_overrides).
"""
from __future__ import annotations

from adalayers.errors import ConfigError
from adalayers.lab.strategies import adapters, concat, finetune, recipe, scalar_mix
from adalayers.lab.strategies.base import Strategy
from adalayers.settings import apply_overrides, build, parse_value

STRATEGIES: dict[str, type[Strategy]] = {
    "adalayers": recipe.AdaLayers,
    "single-layer": recipe.SingleLayer,
    "last-layer": recipe.LastLayer,
    "scalar-mix": scalar_mix.ScalarMix,
    "concat": concat.Concat,
    "finetune": finetune.Finetune,
    "finetune-top": finetune.FinetuneTop,
    "adapters": adapters.Adapters,
    "adapters-unshared": adapters.AdaptersUnshared,
    "adapters-shared3": adapters.AdaptersShared3,
}


def make(spec: str, overrides: list[str] | None = None) -> Strategy:
    """'finetune-top:3' + ['lr=5e-5'] -> a strategy with a validated config."""
    name, _, arg = spec.strip().partition(":")
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})")
    cls = STRATEGIES[name]
    values, problems = {}, []
    if arg:
        if cls.arg_field is None:
            problems.append(f"strategy {name} takes no ':N' argument, got {spec!r}")
        else:
            values[cls.arg_field] = parse_value(arg)
    elif cls.arg_field is not None and cls.arg_field in getattr(cls, "required_args", ()):
        problems.append(f"strategy {name} needs an argument: {name}:N ({cls.arg_field})")
    apply_overrides(values, overrides, problems, need_section=False,
                    example=f"a setting of strategy {name}: --strategy-set {name}.FIELD=VALUE")
    conf = build(cls.Config, values, f"strategy {spec}: ", problems)
    if problems:
        raise ConfigError("invalid strategy settings:\n  - " + "\n  - ".join(problems))
    return cls(spec.strip(), conf)
