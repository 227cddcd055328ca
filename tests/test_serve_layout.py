"""The service's layout: one way to add an endpoint group, and one field per `adalayers serve` setting.

No model is loaded: these read the parser, ServeConfig and the routers' modules.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import typing

import pytest

from adalayers import cli
from adalayers.errors import ConfigError
from adalayers.serve.config import ServeConfig, serve_flag


def _serve_parser() -> argparse.ArgumentParser:
    return cli.build_parser()._subparsers._group_actions[0].choices["serve"]


def _other_value(name: str, field):
    """A valid value of the field that is not its default, and the text that says it on the command line."""
    kind = [a for a in typing.get_args(field.annotation) if a is not type(None)] or [field.annotation]
    if typing.get_origin(field.annotation) is typing.Literal:
        value = next(v for v in typing.get_args(field.annotation) if v != field.default)
        return value, str(value)
    kind = kind[0]
    if name == "guard":  # a list of rules in their own syntax (serve/guards.py)
        return ["some-head:some-label>=0.5"], "some-head:some-label>=0.5"
    if name == "api_key":  # at least 16 characters
        return "some-api-key-of-sixteen-characters", "some-api-key-of-sixteen-characters"
    if kind is int or kind is float:
        value = kind((field.default or 8) + 3)
        return value, str(value)
    return f"some-{name}", f"some-{name}"


def test_every_setting_is_one_flag_built_from_its_field():
    """ServeConfig's fields and `adalayers serve`'s setting flags are the same set, with the field's help,
    and a value given on the command line arrives in the field (a new setting is one field)."""
    parser = _serve_parser()
    by_dest = {a.dest: a for a in parser._actions if a.option_strings}
    argv, expected = ["--heads", "RUN"], {}
    for name, field in ServeConfig.model_fields.items():
        action = by_dest[name]
        assert action.option_strings[0] == serve_flag(name)
        assert action.help == ServeConfig.help(name) and action.help
        if field.annotation is bool:
            argv.append(serve_flag(name))
            expected[name] = not field.default
        else:
            assert action.default == field.default
            expected[name], text = _other_value(name, field)
            argv += [serve_flag(name), text]
    args = parser.parse_args(argv)
    cfg = ServeConfig(**{name: getattr(args, name) for name in ServeConfig.model_fields})
    assert {name: getattr(cfg, name) for name in expected} == expected
    defaults = parser.parse_args(["--heads", "RUN"])
    assert ServeConfig(**{n: getattr(defaults, n) for n in ServeConfig.model_fields}) == ServeConfig()


@pytest.mark.parametrize("name, flag", [("num_threads", "--threads"), ("primary", "--no-primary"),
                                        ("request_timeout_s", "--request-timeout"), ("ui", "--no-ui"),
                                        ("continuous_batching", "--no-continuous-batching"),
                                        ("max_batch_tokens", "--max-batch-tokens")])
def test_flag_names_stay_what_the_docs_say(name, flag):
    assert serve_flag(name) == flag


def test_a_bad_value_names_its_flag():
    with pytest.raises(ConfigError, match=r"^--keep-alive: must be at least 1, got 0$"):
        ServeConfig(keep_alive_s=0)
    assert cli.main(["serve", "--heads", "nowhere", "--threads", "0"]) == 2
    with pytest.raises(ConfigError, match=r"^--max-bach: Extra inputs are not permitted, got 4$"):
        ServeConfig(max_bach=4)  # a settings dict with a typo (Ray Serve replicas are built from one)


def test_every_router_module_is_registered_the_one_way():
    """Each module of serve/routers has add_routes(app, state), and create_app registers every one."""
    from adalayers.serve import app as app_module
    from adalayers.serve import routers

    modules = {importlib.import_module(f"adalayers.serve.routers.{m.name}")
               for m in pkgutil.iter_modules(routers.__path__)}
    assert modules == set(app_module.ROUTERS)
    for module in modules:
        assert list(inspect.signature(module.add_routes).parameters) == ["app", "state"], module.__name__
