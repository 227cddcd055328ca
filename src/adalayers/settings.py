"""Declared settings: a pydantic model per config section, checked in one pass, every problem one line.

A `Section` declares its fields with `setting(default, help, **constraints)` (pydantic's Field: ge, gt,
le, Literal types, ...). `build(cls, data, where, problems)` validates a mapping (from YAML, JSON or
`--set` overrides) and turns each pydantic error into one line naming the field:

    train.lr: expected float, got 'fast'
    mixer.k: must be at least 1, got 0
    train.lrr: unknown field; did you mean train.lr? (known: ...)

Values are checked strictly (no '3' for 3, no 1 for true), except that a float field takes the
strings YAML 1.1 reads for numbers such as 1e-4. Used by the run config (adalayers.config) and by
the lab's configs (multi-task runs, strategies).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from adalayers.errors import ConfigError

_BOUNDS = {"greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
           "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
           "finite_number": "must be a finite number"}


def setting(default, help: str, **constraints):
    """A field with its default and help text (pydantic Field; a list or dict default is copied per instance)."""
    if isinstance(default, (list, dict)):
        return Field(default_factory=lambda: type(default)(default), description=help, **constraints)
    return Field(default, description=help, **constraints)


def check(ok, problem: str) -> AfterValidator:
    """A value check for Annotated[...]: the value when ok(value) (or None), else the error 'problem, got VALUE'."""
    def run(value):
        if value is not None and not ok(value):
            raise ValueError(problem)
        return value
    return AfterValidator(run)


def _bare(tp):
    """A type without its Annotated[...] checks (LR -> float)."""
    return typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp


def _admits(tp, kind) -> bool:
    """Whether a field of type `tp` (LR | None: a union of checked types too) takes a `kind`."""
    tp = _bare(tp)
    return tp is kind or (typing.get_origin(tp) is not None and kind in map(_bare, typing.get_args(tp)))


class Section(BaseModel):
    """A config section: unknown fields are refused, floats must be finite, values are not coerced when
    read through `build` (a YAML '1e-4' still reads as the float it means)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    RENAMED: ClassVar[dict] = {}  # old field name -> its name now (an error names both)

    @model_validator(mode="before")
    @classmethod
    def _yaml_numbers(cls, data):
        if isinstance(data, dict):
            data = dict(data)  # the caller's mapping stays as it was
            for name, value in list(data.items()):
                field = cls.model_fields.get(name)
                if field is not None and isinstance(value, str) and _admits(field.annotation, float):
                    try:
                        data[name] = float(value)
                    except ValueError:
                        pass
        return data

    def to_dict(self) -> dict:
        return self.model_dump(warnings=False)  # values set in code are given back as they are

    @classmethod
    def help(cls, name: str) -> str:
        f = cls.model_fields[name]
        return f"{f.description} (default: {f.get_default(call_default_factory=True)})"


def fields_of(cls) -> dict[str, Any]:
    """A settings class's field names -> their types (a pydantic model or a dataclass)."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {name: f.annotation for name, f in cls.model_fields.items()}
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _section_type(tp):
    """The settings class a field holds (a nested section), or None."""
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and (issubclass(t, BaseModel) or dataclasses.is_dataclass(t)):
            return t
    return None


@functools.lru_cache(maxsize=None)
def _model_of(cls) -> type[BaseModel]:
    """A pydantic Section with a dataclass's fields and defaults, to validate the dataclass by."""
    fields = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else Field(default_factory=f.default_factory)
        fields[f.name] = (typing.get_type_hints(cls)[f.name], default)
    return create_model(cls.__name__, __base__=Section, **fields)


def did_you_mean(key: str, names, where: str = "") -> str:
    """'; did you mean train.lr?' for the closest name (difflib), or '' when none is close."""
    close = difflib.get_close_matches(str(key), sorted(names), n=1, cutoff=0.6)
    return f"; did you mean {where}{close[0]}?" if close else ""


def _type_name(tp) -> str:
    tp = _bare(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(t) for t in typing.get_args(tp))
    if tp is type(None):
        return "None"
    return tp.__name__ if typing.get_origin(tp) is None and isinstance(tp, type) else str(tp).replace("typing.", "")


def _choices(ctx: dict, optional: bool) -> str:
    names = [c.strip().strip("'\"") for c in str(ctx.get("expected", "")).replace(" or ", ", ").split(",")]
    if len(names) == 1:
        return f"must be {'null or ' if optional else ''}{names[0]}"
    if len(names) > 3:
        return "must be one of " + ", ".join(names)
    return f"must be {', '.join(names[:-1])} or {names[-1]}"


def _message(err: dict, tp) -> str:
    """One pydantic error as 'problem, got VALUE' (`tp`: the type of the field it is about)."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in ctx.items()}
    got = f", got {value!r}" if "input" in err and not isinstance(value, (dict, list)) else ""
    if kind in _BOUNDS:
        text = "must be positive" if kind == "greater_than" and ctx.get("gt") == 0 else _BOUNDS[kind].format(**ctx)
        return text + got
    if kind == "literal_error":
        return _choices(ctx, _admits(tp, type(None))) + got
    if kind == "value_error":
        return err["msg"].removeprefix("Value error, ") + got
    if _section_type(tp) is not None and not isinstance(value, dict):
        return f"expected a mapping, got {type(value).__name__}"
    return f"expected {_type_name(tp)}{got}"


def problems_of(e: ValidationError, cls, where: str = "") -> tuple[list[str], list[tuple]]:
    """The errors of validating `cls` as one line each, and the place (a tuple of keys) of each bad value."""
    lines, places, seen = [], [], set()
    for err in e.errors():
        node, path, tp = cls, [], None
        for key in err["loc"]:
            fields = fields_of(node) if node is not None else {}
            if key not in fields:
                break
            path.append(key)
            tp = fields[key]
            node = _section_type(tp)
        place = tuple(path)
        rest = err["loc"][len(path):]
        if err["type"] in ("extra_forbidden", "invalid_key") and rest:
            parent = node if node is not None else cls
            names, renamed = fields_of(parent), getattr(parent, "RENAMED", {})
            key = err["input"] if err["type"] == "invalid_key" else rest[0]  # a key that is no text: as it is
            at = where + "".join(f"{p}." for p in path)
            if key in renamed and renamed[key] in names:
                lines.append(f"{at}{key}: renamed to {at}{renamed[key]}; rename it in your config")
            else:
                known = f"known: {', '.join(sorted(names))}" if names else "it has no fields"
                lines.append(f"{at}{key}: unknown field{did_you_mean(key, names, at)} ({known})")
            places.append(place + (key,))
            continue
        if place in seen:
            continue  # one line a field (a union reports each of its types)
        seen.add(place)
        if err["type"] == "value_error" and not rest and (not path or _section_type(tp) is not None):
            lines += err["msg"].removeprefix("Value error, ").splitlines()  # a section's own check, lines named
            continue
        name = where + ".".join(str(p) for p in path)
        lines.append(f"{name or where.rstrip('.') or 'config'}: {_message(err, tp)}")
        places.append(place)
    return lines, places


def _without(data: dict, place: tuple) -> None:
    if not place:
        return
    node = data
    for key in place[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(place[-1], None)


def build(cls, data, where: str = "", problems: list[str] | None = None):
    """`cls` (a Section, or a dataclass validated as one) from a mapping: every problem is appended to
    `problems` as one line ('where' prefixes the names), and a bad value leaves its field's default (a
    failed check across fields: every field's). Such checks are left out when they speak of a field whose
    value was refused, so that no line speaks of a default."""
    problems = [] if problems is None else problems
    if not isinstance(data, dict):
        problems.append(f"{where.rstrip('.') or 'config'}: expected a mapping, got {type(data).__name__}")
        data = {}
    model = cls if issubclass(cls, BaseModel) else _model_of(cls)
    data, broken = _copy(data), []
    for _ in range(8):
        try:
            out = model.model_validate(data, strict=True)
            break
        except ValidationError as e:
            lines, places = problems_of(e, model, where)
            problems += [p for p in lines if p not in problems and not any(b in p for b in broken)]
            broken += [where + ".".join(map(str, p)) for p in places]
            if not places:
                out = model.model_construct()  # only cross-field checks failed: reported above
                break
            for place in places:
                _without(data, place)
    else:
        out = model.model_construct()
    return out if model is cls else cls(**{k: getattr(out, k) for k in fields_of(cls)})


def _copy(data):
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in data.items()} if isinstance(data, dict) else data


# --- --set overrides and YAML files ------------------------------------------------------------

def parse_value(text: str):
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
            node[name] = parse_value(value)


def field_paths(cls, where: str = "") -> dict[str, Any]:
    """Every 'section.field' of a settings class, to its type (sections too)."""
    out = {}
    for name, tp in fields_of(cls).items():
        out[where + name] = tp
        if _section_type(tp) is not None:
            out.update(field_paths(_section_type(tp), f"{where}{name}."))
    return out


def override_problems(overrides: list[str] | None, cls, aliases=()) -> list[str]:
    """--set items that name no field of `cls`, each with the flag it came from and the closest field (or
    alias: another accepted spelling): "--set train.lrr=1e-3: no field train.lrr; did you mean train.lr?"."""
    paths = field_paths(cls)
    problems = []
    for item in overrides or []:
        key = item.partition("=")[0].strip()
        *sections, name = key.split(".")
        parent = ".".join(sections)
        renamed = getattr(_section_type(paths.get(parent)), "RENAMED", {}) if parent else {}
        if "=" not in item or "." not in key or key in paths:
            continue  # malformed items are reported by apply_overrides
        if any(_admits(paths.get(".".join(sections[:i])), dict) for i in range(1, len(sections) + 1)):
            continue  # a key inside a free-form mapping (task.options.x, tune.space.train.lr)
        if name in renamed:
            problems.append(f"--set {item}: {key} is renamed to {parent}.{renamed[name]}")
            continue
        known = [p for p in (*paths, *aliases) if p.count(".") == key.count(".")]
        problems.append(f"--set {item}: no field {key}{did_you_mean(key, known)}")
    return problems


def raise_problems(problems: list[str], title: str) -> None:
    """Nothing for no problems; one problem as its line; several as 'TITLE:' and one line each."""
    if len(problems) == 1 and title.startswith("invalid --set"):
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{title}:\n  - " + "\n  - ".join(problems))


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


# --- comparing two stored configs ----------------------------------------------------------------

def _same(name: str, a, b, paths: set[str]) -> bool:
    if a == b:
        return True
    if name in paths and isinstance(a, str) and isinstance(b, str):
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()  # one place, spelled twice
    return False


def _differ(where: str, a: dict, b: dict, left_out: set, paths: set[str], inner: set[str], diffs: list) -> None:
    for key in sorted(set(a) | set(b)):
        name, x, y = f"{where}.{key}", a.get(key, "(absent)"), b.get(key, "(absent)")
        if key in left_out:
            continue
        if isinstance(x, dict) and isinstance(y, dict) and name in inner:
            _differ(name, x, y, set(), paths, inner, diffs)
        elif not _same(name, x, y, paths):
            diffs.append(f"{name}: {x!r} there, {y!r} now")


def compare(old: dict, new: dict, ignore: dict[str, set[str] | None], paths: set[str] = frozenset(),
            inner: set[str] = frozenset()) -> list[str]:
    """Where two config dicts of sections disagree, as 'section.field: OLD there, NEW now'. `ignore` maps a
    section to the fields left out (None: the whole section); the fields named in `paths` are compared
    as the places they name from the current folder; `inner` names the sections inside sections."""
    diffs: list[str] = []
    for section in sorted(set(old) | set(new)):
        left_out = ignore.get(section, set())
        if left_out is None:
            continue
        a, b = old.get(section) or {}, new.get(section) or {}
        if not isinstance(a, dict) or not isinstance(b, dict):
            if a != b:
                diffs.append(f"{section}: {a!r} there, {b!r} now")
            continue
        _differ(section, a, b, left_out, paths, inner, diffs)
    return diffs
