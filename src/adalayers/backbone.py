"""The frozen base model and its layer taps.

Hidden states are read with forward hooks as each layer computes them (a pre-hook on the
first layer sees the embedding output), never by asking the model for all hidden states.
The base's own outputs are untouched: hooks only read. Raising `_StopForward` from a hook
after the deepest layer anyone needs is how early exit works.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from adalayers.errors import ModelError
from adalayers import model_packages

Tap = Callable[[int, torch.Tensor], None]  # tap(layer_index, hidden_state (B, T, d))


class _StopForward(Exception):
    pass


@dataclass
class BaseOutput:
    """What the main model itself produced (None when the pass stopped early)."""
    last_hidden_state: torch.Tensor | None
    pooled: torch.Tensor | None        # sentence embedding: masked mean of the last layer
    logits: torch.Tensor | None        # for a base with its own task head


def resolve(name: str) -> str:
    """An alias, a local folder, or (when a network exists) a hub id -> something from_pretrained takes."""
    if name in model_packages.ALIASES:
        return str(model_packages.path_for(name))
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser().resolve())
    if name.startswith((".", "/", "~")) or os.sep in name and not _looks_like_hub_id(name):
        raise ModelError(f"base model folder not found: {name}")
    return name  # a hub id; from_pretrained fails clearly when offline


def _looks_like_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


def _find_layers(module: nn.Module) -> nn.ModuleList | None:
    for attr in ("layer", "layers", "block"):
        layers = getattr(module, attr, None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            return layers
    return None


class Backbone(nn.Module):
    """A frozen Hugging Face model with hooks on its embedding output and every layer."""

    def __init__(self, model: nn.Module, tokenizer, name: str, states: str = "encoder"):
        super().__init__()
        self.model, self.tokenizer, self.name, self.states = model, tokenizer, name, states
        self.model.eval()
        self.model.requires_grad_(False)
        self.is_encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        if self.is_encoder_decoder:
            core = model.get_decoder() if states == "decoder" else model.get_encoder()
        else:
            core = getattr(model.base_model, "encoder", model.base_model)
        layers = _find_layers(core)
        if layers is None:
            raise ModelError(f"{name}: cannot find the transformer layers of {type(model).__name__}")
        self.layers = layers
        self.num_layers = len(layers) + 1  # embedding output counts as layer 0
        self.hidden_size = int(getattr(model.config, "hidden_size", None) or model.config.d_model)
        self._fingerprint: str | None = None

    # --- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, name: str, states: str = "encoder", device: str | torch.device = "cpu") -> "Backbone":
        import transformers
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        source = resolve(name)
        try:
            config = AutoConfig.from_pretrained(source)
            tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load base model {name!r} ({source}): {str(e).splitlines()[0]}") from None
        model_cls = AutoModel
        for arch in getattr(config, "architectures", None) or []:
            # keep a base's own task head (e.g. ...ForSequenceClassification) so its output is served too
            if arch.endswith(("ForSequenceClassification", "ForTokenClassification")) and hasattr(transformers, arch):
                model_cls = getattr(transformers, arch)
        model = model_cls.from_pretrained(source)
        return cls(model, tokenizer, name, states).to(device)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def fingerprint(self) -> str:
        """sha256 over the model's config and weights: heads only load onto the base they were trained on."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            cfg = self.model.config.to_dict()
            for key in ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures"):
                cfg.pop(key, None)
            h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
            for key, tensor in sorted(self.model.state_dict().items()):
                h.update(key.encode())
                h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # --- running ---------------------------------------------------------------------------
    def tokenize(self, texts: list[str], pairs: list[str] | None = None, max_length: int = 128):
        enc = self.tokenizer(texts, pairs, padding=True, truncation=True, max_length=max_length,
                             return_tensors="pt")
        return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    @torch.no_grad()
    def forward(self, batch: dict, taps: list[Tap] = (), stop_after: int | None = None) -> BaseOutput:
        """Run the base; each tap sees (layer index, hidden state) as the layer computes it.

        stop_after=i stops the pass right after layer i (early exit; BaseOutput is then empty).
        """
        handles = []

        def emit(i, hidden):
            for tap in taps:
                tap(i, hidden)
            if stop_after is not None and i >= stop_after:
                raise _StopForward

        def pre_hook(_module, args, kwargs):
            emit(0, args[0] if args else kwargs["hidden_states"])

        def make_hook(i):
            def hook(_module, _args, output):
                emit(i, output[0] if isinstance(output, (tuple, list)) else output)
            return hook

        if taps or stop_after is not None:
            handles.append(self.layers[0].register_forward_pre_hook(pre_hook, with_kwargs=True))
            for i, layer in enumerate(self.layers, start=1):
                handles.append(layer.register_forward_hook(make_hook(i)))
        inputs = {k: v.to(self.device) for k, v in batch.items()
                  if k in ("input_ids", "attention_mask", "token_type_ids")}
        if self.is_encoder_decoder:  # the main model runs whole: decoder fed the shifted input
            inputs.pop("token_type_ids", None)
            inputs["decoder_input_ids"] = self._decoder_inputs(inputs["input_ids"])
        try:
            out = self.model(**inputs)
        except _StopForward:
            return BaseOutput(None, None, None)
        finally:
            for h in handles:
                h.remove()
        last = getattr(out, "last_hidden_state", None)
        if last is None and getattr(out, "encoder_last_hidden_state", None) is not None:
            last = out.encoder_last_hidden_state
        pooled = None
        if last is not None and last.shape[1] == inputs["attention_mask"].shape[1]:
            m = inputs["attention_mask"].unsqueeze(-1).to(last.dtype)
            pooled = (last * m).sum(1) / m.sum(1).clamp(min=1)
        return BaseOutput(last, pooled, getattr(out, "logits", None))

    def _decoder_inputs(self, input_ids: torch.Tensor) -> torch.Tensor:
        start = self.model.config.decoder_start_token_id
        if start is None:
            start = self.model.config.pad_token_id or 0
        shifted = input_ids.new_full(input_ids.shape, self.model.config.pad_token_id or 0)
        shifted[:, 1:] = input_ids[:, :-1]
        shifted[:, 0] = start
        return shifted
