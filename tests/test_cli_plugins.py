"""The command line finds commands of other packages through the entry-point group adalayers.commands; the lab
registers its commands there (pyproject.toml), so the product never imports the lab."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from adalayers import cli

ROOT = Path(__file__).resolve().parents[1]
LAB_COMMANDS = {"report", "sweep-layers", "compare", "ablate-adapters", "compare-multitask", "tune"}


def declared() -> list[EntryPoint]:
    """The group as pyproject.toml declares it (what an install writes into the package's metadata)."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][cli.ENTRY_POINT_GROUP]
    return [EntryPoint(name, value, cli.ENTRY_POINT_GROUP) for name, value in table.items()]


def _use(monkeypatch, eps: list[EntryPoint]) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [e for e in eps if e.group == group])


def _commands(parser) -> dict:
    return parser._subparsers._group_actions[0].choices


def test_the_lab_commands_come_from_the_declared_entry_points(monkeypatch):
    _use(monkeypatch, declared())
    parser = cli.build_parser()
    assert LAB_COMMANDS <= set(_commands(parser))
    args = parser.parse_args(["train", "c.yaml", "--out", "o", "--seeds", "3", "--ensemble"])
    assert (args.seeds, args.ensemble) == (3, True)


def test_without_plugins_the_product_has_its_own_commands_only(monkeypatch):
    _use(monkeypatch, [])
    commands = _commands(cli.build_parser())
    assert {"train", "evaluate", "predict", "cache", "serve", "predict-files", "export"} <= set(commands)
    assert not LAB_COMMANDS & set(commands)
    assert "--seeds" not in commands["train"]._option_string_actions


def test_the_product_never_imports_the_lab():
    """Every product command's module, imported to build the parser without plugins: no adalayers.lab module."""
    code = ("import sys\n"
            "from adalayers import cli; cli.entry_points = lambda group: []; cli.build_parser()\n"
            "assert 'adalayers.cli.train' in sys.modules\n"
            "print(sorted(n for n in sys.modules if n.startswith('adalayers.lab')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_lab_command_module_is_declared():
    """A lab module with add_commands that pyproject.toml does not declare would be a command nobody can run."""
    targets = {e.value for e in declared()}
    lab = ROOT / "src" / "adalayers" / "lab"
    modules = {".".join(p.relative_to(ROOT / "src").with_suffix("").parts) for p in lab.rglob("*.py")
               if "\ndef add_commands(" in p.read_text()}
    assert {f"{m}:add_commands" for m in modules} == targets


def plugin_hello(sub) -> None:  # a third-party package's add_commands
    p = sub.add_parser("hello", help="say hello")
    p.add_argument("--name", default="world", help="whom to greet")
    p.set_defaults(fn=lambda args: print(f"hello {args.name}") or 0)


def test_a_plugin_adds_a_command_and_a_broken_one_costs_only_its_own(monkeypatch, capsys, caplog):
    _use(monkeypatch, [EntryPoint("hello", f"{__name__}:plugin_hello", cli.ENTRY_POINT_GROUP),
                       EntryPoint("broken", "no_such_package.cli:add_commands", cli.ENTRY_POINT_GROUP)])
    assert cli.main(["hello", "--name", "lab"]) == 0
    assert capsys.readouterr().out == "hello lab\n"
    assert "the commands of broken (no_such_package.cli:add_commands) are not available" in caplog.text


def test_train_seeds_is_checked_by_the_lab(monkeypatch, capsys):
    _use(monkeypatch, declared())
    assert cli.main(["train", "c.yaml", "--out", "o", "--seeds", "1", "--ensemble"]) == 2
    assert capsys.readouterr().err.strip() == "error: --ensemble: needs --seeds N with N >= 2"


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"]])
def test_help_lists_the_lab(monkeypatch, capsys, argv):
    _use(monkeypatch, declared())
    with pytest.raises(SystemExit):
        cli.main(argv)
    out = capsys.readouterr().out
    assert all(c in out for c in LAB_COMMANDS) if argv == ["--help"] else "--seeds N" in out
