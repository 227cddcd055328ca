"""The default runtime: a transformers base (adalayers.model.backbone.Backbone) run by PyTorch, its layers hooked.

    runtime = TorchRuntime(Backbone.load("minilm-l6"))
    own, logits = runtime.forward(batch, heads, stop=None)     # one tapped pass (adalayers.infer.runtime)
    decoder = runtime.decoder()                                 # a decoder LLM: prefill + decode steps, KV cache
"""
from __future__ import annotations

import inspect

import torch

from adalayers.errors import ModelError
from adalayers.infer.runtime import Runtime, TappedRuntime
from adalayers.model.backbone import Backbone, positions


class TorchRuntime(TappedRuntime):
    """The transformers base's tapped pass; generation through its KV cache (TorchDecoder)."""

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
        return self.base.is_causal  # transformers' DynamicCache: adalayers.infer.batching merges and splits it

    def step(self, input_ids: torch.Tensor, attention: torch.Tensor, cache, tap):
        """One decoder forward with an explicit KV cache (None: a prefill), `tap` on its layers:
        (next-token logits (B, vocab), the new cache). Serve's scheduler merges and splits caches between steps."""
        out = torch_forward(self.base, input_ids, attention, cache, tap)
        return out.logits[:, -1], cache_of(out)


def as_runtime(base) -> Runtime:
    """A Runtime as it is; a transformers Backbone in its TorchRuntime."""
    if isinstance(base, Runtime):
        return base
    if not isinstance(base, Backbone):
        raise ModelError(f"not a base the inference doors can run: {type(base).__name__}")
    return TorchRuntime(base)


class TorchDecoder:
    """Prefill and decode steps of a transformers decoder, its KV cache kept between calls, layer hooks on
    (adalayers.infer.runtime.Decoder)."""

    def __init__(self, backbone: Backbone):
        model = backbone.model
        if not backbone.is_causal or model.get_output_embeddings() is None:
            raise ModelError(f"{backbone.name} is not a decoder LLM with an LM head: it cannot generate")
        self.backbone, self.model, self.cache = backbone, model, None

    def eos_ids(self) -> set[int]:
        tok, config = self.backbone.tokenizer, self.model.generation_config
        return {t for t in [tok.eos_token_id] + _as_list(getattr(config, "eos_token_id", None)) if t is not None}

    def __call__(self, input_ids: torch.Tensor, attention: torch.Tensor, tap) -> torch.Tensor:
        out = torch_forward(self.backbone, input_ids, attention, self.cache, tap)
        self.cache = cache_of(out)
        return out.logits[:, -1]


@torch.no_grad()
def torch_forward(backbone: Backbone, input_ids: torch.Tensor, attention: torch.Tensor, cache, tap):
    """One forward of a transformers decoder (prefill: cache None; decode: one token per row), KV cache on,
    `tap` on its layers (None: no hooks): the model's output."""
    cache_arg = "cache" if "cache" in _parameters(backbone.model) else "past_key_values"  # renamed in transformers 5.2x
    with backbone.hooked(tap):
        return backbone.model(input_ids=input_ids, attention_mask=attention, use_cache=True, **{cache_arg: cache},
                              position_ids=positions(attention)[:, -input_ids.shape[1]:], logits_to_keep=1)


def cache_of(out):
    """The KV cache a forward returned (`cache` in transformers >= 5.2x, `past_key_values` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _parameters(model) -> frozenset[str]:
    """The names model.forward takes."""
    return frozenset(inspect.signature(model.forward).parameters)


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]
