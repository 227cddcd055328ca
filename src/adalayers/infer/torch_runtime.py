"""The default runtime: a transformers base (adalayers.model.backbone.Backbone) run by PyTorch, its layers hooked.

    runtime = TorchRuntime(Backbone.load("minilm-l6"))
    own, logits = runtime.forward(batch, heads, stop=None)     # one tapped pass (adalayers.infer.runtime)
    decoder = runtime.decoder()                                 # a decoder LLM: prefill + decode steps, KV cache
"""
from __future__ import annotations

import contextlib
import functools
import inspect

import torch
import torch.nn.functional as F

from adalayers.errors import ModelError
from adalayers.infer.runtime import Runtime, TappedRuntime
from adalayers.model.backbone import Backbone, positions


class TorchRuntime(TappedRuntime):
    """The transformers base's tapped pass; generation through its KV cache (TorchDecoder)."""

    interruptible = True  # an exception from a layer hook leaves the forward

    def own_output(self) -> tuple[str, list[str]]:
        model = self.base.model
        kind = type(model).__name__
        if self.base.is_causal or not kind.endswith(("ForSequenceClassification", "ForTokenClassification")):
            return super().own_output()
        labels = [model.config.id2label.get(j, str(j)) for j in range(model.config.num_labels)]
        return ("tokens" if kind.endswith("ForTokenClassification") else "classes"), labels

    def decoder(self) -> "TorchDecoder":
        return TorchDecoder(self.base)

    @property
    def continuous_batching(self) -> bool:
        return self.base.is_causal  # transformers' DynamicCache (KVCache) merges and splits between steps


def as_runtime(base) -> Runtime:
    """A Runtime as it is; a transformers Backbone in its TorchRuntime."""
    if isinstance(base, Runtime):
        return base
    if not isinstance(base, Backbone):
        raise ModelError(f"not a base the inference doors can run: {type(base).__name__}")
    return TorchRuntime(base)


class TorchDecoder:
    """Prefill and decode steps of a transformers decoder, layer hooks on (adalayers.infer.runtime.Decoder)."""

    interruptible = True  # an exception from a layer hook leaves the forward

    def __init__(self, backbone: Backbone):
        model = backbone.model
        if not backbone.is_causal or model.get_output_embeddings() is None:
            raise ModelError(f"{backbone.name} is not a decoder LLM with an LM head: it cannot generate")
        self.backbone, self.model = backbone, model

    def eos_ids(self) -> set[int]:
        tok, config = self.backbone.tokenizer, self.model.generation_config
        return {t for t in [tok.eos_token_id] + _as_list(getattr(config, "eos_token_id", None)) if t is not None}

    def prefill(self, input_ids: torch.Tensor, attention: torch.Tensor, tap) -> tuple[torch.Tensor, "KVCache"]:
        return self.step(input_ids, attention, None, tap)

    def step(self, input_ids: torch.Tensor, attention: torch.Tensor, cache: "KVCache | None", tap,
             logits_for: list[int] | None = None, stop_after: int | None = None
             ) -> tuple[torch.Tensor | None, "KVCache"]:
        """One forward (adalayers.infer.runtime.Decoder.step): the LM head runs on the rows of logits_for
        only, and not at all when it is empty; the pass then ends after state stop_after (default: the last)."""
        if logits_for is not None and not logits_for:
            if cache is None:
                raise ModelError("a prefill always computes next-token logits")
            stop = self.backbone.num_layers - 1 if stop_after is None else stop_after
            torch_forward(self.backbone, input_ids, attention, cache.cache, tap, stop)
            return None, cache  # extended in place, complete up to the layer of state `stop`
        with _lm_head_rows(self.model, logits_for):
            out = torch_forward(self.backbone, input_ids, attention, None if cache is None else cache.cache, tap)
        return out.logits[:, -1], KVCache(cache_of(out))


class KVCache:
    """transformers' DynamicCache as a Batch reshapes it (adalayers.infer.runtime.Cache): full-attention layers
    (B, H, T, D) and sliding-window layers (the last min(T, W - 1) columns, `cumulative_length` = T); other
    cache kinds are refused when rows must be selected or merged."""

    def __init__(self, cache):
        self.cache = cache

    def select(self, idx: list[int]) -> "KVCache":
        at = torch.tensor(idx, dtype=torch.long)
        for layer in self._layers():
            at = at.to(layer.keys.device)
            layer.keys, layer.values = layer.keys.index_select(0, at), layer.values.index_select(0, at)
        return self

    def merged(self, other: "KVCache", width: int) -> "KVCache":
        for mine, theirs in zip(self._layers(), other._layers()):
            size = max(mine.keys.shape[-2], theirs.keys.shape[-2])
            mine.keys = torch.cat([_pad(mine.keys, size), _pad(theirs.keys, size)], 0)
            mine.values = torch.cat([_pad(mine.values, size), _pad(theirs.values, size)], 0)
            if hasattr(mine, "cumulative_length"):
                mine.cumulative_length = width
        return self

    def trimmed(self, width: int) -> "KVCache":
        for layer in self._layers():
            size = min(layer.keys.shape[-2], width)
            layer.keys, layer.values = layer.keys[:, :, -size:], layer.values[:, :, -size:]
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length = width
        return self

    def _layers(self) -> list:
        layers = getattr(self.cache, "layers", None)
        if layers is None or not all(hasattr(x, "keys") and torch.is_tensor(x.keys) for x in layers):
            raise ModelError(f"batched generation needs transformers' DynamicCache; got {type(self.cache).__name__}")
        return layers


def _pad(x: torch.Tensor, size: int) -> torch.Tensor:
    """(B, H, L, D) left-padded with zeros to L = size."""
    return F.pad(x, (0, 0, size - x.shape[-2], 0)) if x.shape[-2] < size else x


@contextlib.contextmanager
def _lm_head_rows(model, rows: list[int] | None):
    """While open, the model's LM head reads only these rows of its input (None: all of them), so its
    logits are (len(rows), ...) and whatever the model does after it (e.g. Gemma's soft-capping) runs on those."""
    if rows is None:
        yield
        return
    at = torch.tensor(rows, dtype=torch.long)
    handle = model.get_output_embeddings().register_forward_pre_hook(
        lambda _module, args: (args[0].index_select(0, at.to(args[0].device)), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def torch_forward(backbone: Backbone, input_ids: torch.Tensor, attention: torch.Tensor, cache, tap,
                  stop_after: int | None = None):
    """One forward of a transformers decoder (prefill: cache None; decode: one token per row), KV cache on,
    `tap` on its layers (None: no hooks): the model's output. stop_after=i ends it after state i (-> None;
    the cache passed in holds the new position in the layers that ran)."""
    cache_arg = "cache" if "cache" in _parameters(backbone.model) else "past_key_values"  # renamed in transformers 5.2x
    return backbone.call_tapped(
        lambda: backbone.model(input_ids=input_ids, attention_mask=attention, use_cache=True, **{cache_arg: cache},
                               position_ids=positions(attention)[:, -input_ids.shape[1]:], logits_to_keep=1),
        tap, stop_after)


def cache_of(out):
    """The KV cache a forward returned (`cache` in transformers >= 5.2x, `past_key_values` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _parameters(model) -> frozenset[str]:
    """The names model.forward takes (read once per model class, not at every decode step)."""
    return _forward_parameters(type(model))


@functools.lru_cache(maxsize=64)
def _forward_parameters(cls) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters) - {"self"}


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]
