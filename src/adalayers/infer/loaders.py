"""The built-in runtimes' loaders (registered by name in adalayers.runtimes): a LoadRequest in, a Loaded out.

    loaded = runtimes.get("torch").load(LoadRequest("minilm-l6", tuple(parse_heads(["runs/cola"]))))
    loaded.runtime, loaded.heads      # the base pass (adalayers.infer.runtime.Runtime) and its Heads

torch and llama.cpp run a base alone and hand its states to the heads (load_heads on it; with no heads, the base
alone: training and evaluation load it so). onnx and onnx-int8 run one graph exported with its heads
(adalayers.infer.onnx). Each loader imports its engine when called.
"""
from __future__ import annotations

from dataclasses import dataclass

from adalayers.infer.heads import Head, heads_states, load_heads
from adalayers.infer.runtime import Runtime
from adalayers.store.head_spec import HeadSpec


@dataclass(frozen=True)
class LoadRequest:
    base: str                           # an alias, a model folder, a hub id, a .gguf file, or an export folder
    heads: tuple[HeadSpec, ...] = ()
    primary: bool = True                # the base's own output too (an exported graph keeps it or not)
    device: object = "auto"             # torch: "auto", "cpu", "cuda" or a torch.device
    states: str | None = None           # torch: "encoder" / "decoder" states; None: what the heads read
    threads: int | None = None          # CPU threads of ONNX Runtime and llama.cpp
    n_ctx: int | None = None            # llama.cpp's context: KV tokens (None: LlamaCppBackbone.load's default)
    n_seq: int | None = None            # ... and sequences


@dataclass(frozen=True)
class Loaded:
    runtime: Runtime
    heads: list[Head]


def load_torch(request: LoadRequest) -> Loaded:
    from adalayers.core import pick_device
    from adalayers.infer.torch_runtime import TorchRuntime
    from adalayers.model.backbone import Backbone

    device = pick_device(request.device) if isinstance(request.device, str) else request.device
    backbone = Backbone.load(request.base, request.states or heads_states(request.heads), device)
    return Loaded(TorchRuntime(backbone), load_heads(backbone, request.heads))


def load_llamacpp(request: LoadRequest) -> Loaded:
    from adalayers.infer.llamacpp_backbone import LlamaCppBackbone

    sizes = {k: v for k, v in (("n_ctx", request.n_ctx), ("n_seq", request.n_seq)) if v is not None}
    backbone = LlamaCppBackbone.load(request.base, threads=request.threads, **sizes)
    return Loaded(backbone, load_heads(backbone, request.heads))


def load_onnx(request: LoadRequest, int8: bool = False) -> Loaded:
    from adalayers.infer import onnx

    runtime, heads = onnx.load(request.base, list(request.heads), primary=request.primary, int8=int8,
                               threads=request.threads)
    return Loaded(runtime, heads)


def load_onnx_int8(request: LoadRequest) -> Loaded:
    return load_onnx(request, int8=True)
