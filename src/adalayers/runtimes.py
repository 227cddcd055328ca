"""The runtimes: which engine runs the base, every name defined here once, each registered with one line.

    runtimes.names()                  -> ("torch", "onnx", "onnx-int8", "llama.cpp"): every runtime
    runtimes.names(trains=True)       -> ("torch", "llama.cpp"): those that run a base alone, whose layer states
                                         any head reads: training and evaluation (model.runtime), predict and
                                         predict-files; the others run a graph exported with its heads
    runtimes.get("onnx").load(request) -> the loader's answer (adalayers.infer.loaders: a LoadRequest in, the
                                         Runtime and its Heads out)
    register_runtime("mine", "my_pkg.engine:load", help="...")   # selectable by SideTasks.load, --runtime
                                                                 # and (trains=True) model.runtime

Read by SideTasks.load, every command's --runtime choices (adalayers.cli.common.add_runtime_arg), the config's
model.runtime check and predict-files' Job. Import-light: nothing here imports torch, onnxruntime or llama_cpp;
a loader is named "module:function" (or given as a callable) and imported when its runtime first loads.

`backend` is the old word for runtime: `deprecated_backend` turns a `backend=` argument into the runtime, with a
DeprecationWarning (kept for one release).
"""
from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Callable

from adalayers.errors import ModelError


@dataclass(frozen=True)
class RuntimeEntry:
    name: str
    loader: str | Callable  # "module:function", imported on first use, or the function itself
    trains: bool = False    # runs a base alone (training, evaluation, predict, predict-files), not only a graph
    help: str = ""          # one phrase for --runtime's help: what runs the base

    def load(self, request):
        """The loader called on `request` (adalayers.infer.loaders.LoadRequest)."""
        loader = self.loader
        if isinstance(loader, str):
            module, _, function = loader.partition(":")
            loader = getattr(importlib.import_module(module), function)
        return loader(request)


_REGISTRY: dict[str, RuntimeEntry] = {}


def register_runtime(name: str, loader: str | Callable, trains: bool = False, help: str = "") -> RuntimeEntry:
    """Make `name` a runtime every door offers; its `loader` takes a LoadRequest and returns a Loaded."""
    if not name or any(c.isspace() or c == "," for c in name):
        raise ModelError(f"runtime {name!r}: a name without spaces or commas")
    _REGISTRY[name] = entry = RuntimeEntry(name, loader, trains, help)
    return entry


def unregister_runtime(name: str) -> None:
    """Forget a runtime registered earlier (a plugin's or a test's)."""
    _REGISTRY.pop(name, None)


def names(trains: bool = False) -> tuple[str, ...]:
    """Every runtime's name in registration order; trains=True: only those that run a base alone."""
    return tuple(n for n, e in _REGISTRY.items() if e.trains or not trains)


def get(name: str, trains: bool = False) -> RuntimeEntry:
    """The runtime named `name`, or a ModelError that lists the choices."""
    entry = _REGISTRY.get(name)
    if entry is None or (trains and not entry.trains):
        raise ModelError(f"runtime {name!r}: choose one of {', '.join(names(trains))}")
    return entry


def describe(trains: bool = False) -> str:
    """'torch: the PyTorch pass; ...': each runtime's help, for --runtime."""
    return "; ".join(f"{e.name}: {e.help}" for e in _REGISTRY.values() if e.help and (e.trains or not trains))


def deprecated_backend(runtime: str, backend: str | None, where: str = "backend=") -> str:
    """The runtime to use: `backend` (the old word, with a DeprecationWarning) when given, else `runtime`."""
    if backend is None:
        return runtime
    warnings.warn(f"{where} is deprecated and will be removed in the next release; use runtime=", DeprecationWarning,
                  stacklevel=3)
    return backend


register_runtime("torch", "adalayers.infer.loaders:load_torch", trains=True, help="the PyTorch pass")
register_runtime("onnx", "adalayers.infer.loaders:load_onnx",
                 help="one exported graph in ONNX Runtime (--base may then be a folder from 'adalayers export'; "
                      "see docs/export.md)")
register_runtime("onnx-int8", "adalayers.infer.loaders:load_onnx_int8", help="the same graph with int8 weights")
register_runtime("llama.cpp", "adalayers.infer.loaders:load_llamacpp", trains=True,
                 help="a GGUF base run quantized by llama.cpp (docs/llm.md)")
