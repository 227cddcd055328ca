"""The runtime registry (adalayers.runtimes): every door reads the same names, one line registers a runtime, and the
old word `backend` still works for one release, with a warning."""
import argparse
import logging
import subprocess
import sys

import pytest

from adalayers import config as config_mod
from adalayers import runtimes
from adalayers.cli import build_parser
from adalayers.errors import ConfigError, ModelError
from adalayers.infer.heads import load_heads
from adalayers.infer.loaders import Loaded
from adalayers.infer.sidetasks import SideTasks
from adalayers.infer.torch_runtime import TorchRuntime

from conftest import tiny_backbone


def runtime_choices(command: str) -> tuple:
    """The --runtime choices of one command, read from the CLI's own parser."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    return tuple(next(a for a in parser._actions if "--runtime" in a.option_strings).choices)


@pytest.fixture
def fake(tokenizer):
    """A runtime 'fake' registered with one line, its loader the tiny bert base: what each load asked for."""
    asked = []

    def load(request):
        asked.append(request)
        base = tiny_backbone("bert", tokenizer)
        return Loaded(TorchRuntime(base), load_heads(base, request.heads))

    runtimes.register_runtime("fake", load, trains=True, help="a test's runtime")
    yield asked
    runtimes.unregister_runtime("fake")


def test_the_built_in_runtimes():
    assert runtimes.names() == ("torch", "onnx", "onnx-int8", "llama.cpp")
    assert runtimes.names(trains=True) == ("torch", "llama.cpp")


def test_every_door_reads_the_one_registry(fake):
    """The CLI's --runtime choices, model.runtime and SideTasks.load all follow the registry: a runtime
    registered with one line is offered by each of them."""
    assert runtime_choices("serve") == runtimes.names()
    for command in ("predict", "predict-files", "evaluate"):
        assert runtime_choices(command) == runtimes.names(trains=True), command
    assert "fake" in runtime_choices("serve") and "fake" in runtime_choices("predict")
    assert config_mod.from_dict({}, ["model.runtime=fake"]).model.runtime == "fake"
    side = SideTasks.load("some-base", [], runtime="fake", primary=False)
    assert fake[0].base == "some-base" and fake[0].heads == () and side.backbone.name == "tiny-bert"


def test_a_runtime_that_does_not_train_is_refused_where_a_base_alone_runs():
    with pytest.raises(ConfigError, match=r"model.runtime: must be torch or llama.cpp, got 'onnx'"):
        config_mod.from_dict({}, ["model.runtime=onnx"])
    with pytest.raises(ModelError, match="runtime 'onnx': choose one of torch, llama.cpp"):
        runtimes.get("onnx", trains=True)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["predict", "runs/x", "t", "--runtime", "onnx"])


def test_unknown_runtime_is_one_line_before_any_head_is_read():
    with pytest.raises(ModelError, match="^runtime 'tf': choose one of torch, onnx, onnx-int8, llama.cpp$"):
        SideTasks.load("minilm-l6", ["no/such/run"], runtime="tf")


def test_the_deprecated_backend_kwarg_warns_and_still_selects(fake):
    with pytest.warns(DeprecationWarning, match="backend= is deprecated"):
        SideTasks.load("b", [], backend="fake", primary=False)
    assert [r.base for r in fake] == ["b"]


def test_the_deprecated_backend_flag_logs_a_warning_and_still_selects(caplog):
    with caplog.at_level(logging.WARNING, logger="adalayers.cli.common"):
        args = build_parser().parse_args(["serve", "--base", "x", "--backend", "onnx"])
    assert args.runtime == "onnx"
    assert "--backend is deprecated" in caplog.text and "--runtime onnx" in caplog.text
    assert build_parser().parse_args(["serve", "--base", "x"]).runtime == "torch"


def test_a_loader_named_by_its_module_is_imported_on_first_use(tokenizer):
    """A "module:function" loader is imported only when its runtime loads: registering imports nothing."""
    runtimes.register_runtime("lazy", "no_such_module_here:load")
    try:
        assert "lazy" in runtimes.names()
        with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
            runtimes.get("lazy").load(None)
    finally:
        runtimes.unregister_runtime("lazy")


def test_the_registry_imports_no_engine():
    """Reading the registry and the config's check import neither torch, onnxruntime nor llama_cpp."""
    code = ("import sys\nfor m in ('torch', 'onnxruntime', 'llama_cpp', 'transformers'): sys.modules[m] = None\n"
            "from adalayers import runtimes, config\nfrom adalayers.store.head_spec import HeadSpec\n"
            "print(runtimes.names(), config.from_dict({}, ['model.runtime=llama.cpp']).model.runtime)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "llama.cpp" in out.stdout
