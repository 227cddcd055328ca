"""HeadSpec: a head named as RUN or NAME=RUN, parsed once where it enters (the CLI, SideTasks.load); errors name
the argument as its caller wrote it ("--heads ..." on the command line, "heads[1] ..." from Python)."""
from pathlib import Path

import pytest

from adalayers import runtimes
from adalayers.cli import main
from adalayers.errors import ConfigError
from adalayers.infer.heads import load_heads
from adalayers.infer.loaders import Loaded
from adalayers.infer.sidetasks import SideTasks
from adalayers.infer.torch_runtime import TorchRuntime
from adalayers.store import hub
from adalayers.store.head_spec import HeadSpec, parse_heads

from conftest import tiny_backbone
from runs_util import make_run


def test_name_is_the_folder_or_given(tmp_path):
    assert HeadSpec.parse(str(tmp_path / "cola")) == HeadSpec("cola", tmp_path / "cola")
    assert HeadSpec.parse(f"acc={tmp_path / 'cola'}") == HeadSpec("acc", tmp_path / "cola")
    assert HeadSpec.parse(tmp_path / "cola") == HeadSpec("cola", tmp_path / "cola")  # a Path as well
    spec = HeadSpec("x", tmp_path)
    assert parse_heads([spec, str(tmp_path / "y")]) == [spec, HeadSpec("y", tmp_path / "y")]  # a HeadSpec passes as it is
    assert str(HeadSpec("acc", Path("runs/cola"))) == "acc=runs/cola"


@pytest.mark.parametrize("arg, problem", [
    ("", r"heads\[1\] '': empty; give RUN_FOLDER or NAME=RUN_FOLDER"),
    ("acc=", r"heads\[1\] 'acc=': no run folder after '='; give NAME=RUN_FOLDER"),
    ("a\x01b=x", r"heads\[1\] 'a\\x01b=x': the task name holds unprintable characters"),
])
def test_bad_heads_from_python_name_their_index(arg, problem):
    with pytest.raises(ConfigError, match=f"^{problem}"):
        parse_heads(["ok", arg])


def test_bad_heads_on_the_command_line_name_the_flag(capsys):
    with pytest.raises(ConfigError, match=r"^--heads 'a\\x01b=x': the task name holds unprintable"):
        parse_heads(["a\x01b=x"], "--heads")
    assert main(["export", "--heads", "acc=", "--out", "x"]) == 2
    assert "--heads 'acc=': no run folder after '='" in capsys.readouterr().err


def test_one_string_for_a_list_is_refused():
    with pytest.raises(ConfigError, match=r"^heads: a list of heads, got one str \('runs/cola'\); wrap it in \[\.\.\.\]"):
        parse_heads("runs/cola")


def test_a_hub_id_is_resolved_once_per_load(tmp_path, tokenizer, monkeypatch):
    """SideTasks.load parses its heads once: the Hub id is resolved once, though the heads' base, states and
    weights are all read from it."""
    base = tiny_backbone("bert", tokenizer)
    run = make_run(tmp_path / "snapshot", base, "sequence", ["bad", "good"], seed=1)
    calls = []
    real = hub.resolve_run
    monkeypatch.setattr(hub, "resolve_run", lambda arg: calls.append(str(arg)) or (
        run if str(arg) == "user/cola-head@main" else real(arg)))

    def load(request):
        return Loaded(TorchRuntime(base), load_heads(base, request.heads))

    runtimes.register_runtime("tiny", load)
    try:
        side = SideTasks.load(None, ["user/cola-head@main"], runtime="tiny", primary=False)
    finally:
        runtimes.unregister_runtime("tiny")
    assert calls == ["user/cola-head@main"]
    assert side.names == ["cola-head"]
