"""The frozen base model and its layer taps.

Hidden states are read with forward hooks as each layer computes them (a pre-hook on the
first layer sees the embedding output), never by asking the model for all hidden states.
The base's own outputs are untouched: hooks only read. Raising `_StopForward` from a hook
after the deepest layer anyone needs is how early exit works.

Decoder LLMs (GPT-2, Llama, Qwen, Gemma, OPT, GPT-NeoX, any GGUF file) are loaded for causal LM,
LM head included, so next-token logits and generated text are still served. Token t of a decoder
sees only tokens up to t; its position ids are counted from the attention mask
(cumsum(mask) - 1), so left and right padding give every real token the states it has alone.
A tokenizer without a pad token pads with its end-of-text token (always masked).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from adalayers.data.templates import prepends_bos
from adalayers.errors import ModelError
from adalayers.files import atomic_write
from adalayers.model import gguf_models, model_packages

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
    """An alias, a local folder, a GGUF file, or (when a network exists) a hub id -> what from_pretrained takes."""
    if name in model_packages.ALIASES:
        return str(model_packages.path_for(name))
    if name.lower().endswith(".gguf"):
        return str(gguf_models.converted(Path(name)))
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser().resolve())
    if name.startswith((".", "/", "~")) or os.sep in name and not _looks_like_hub_id(name):
        raise ModelError(f"base model folder not found: {name}")
    return name  # a hub id; from_pretrained fails clearly when offline


def _looks_like_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


# Where the stack of transformer layers sits below a model's base_model (or its encoder/decoder),
# tried in order; a new layout is one more entry.
LAYOUTS = (
    "encoder.layer",      # BERT, MiniLM, MPNet, RoBERTa
    "layer", "block",     # encoder stacks; T5
    "layers",             # Llama, Qwen2, Gemma 3, Mistral, GPT-NeoX, BART/T5 decoder stacks
    "h",                  # GPT-2, GPT-J, Falcon, BLOOM
    "decoder.layers",     # OPT
    "encoder.layers",
)


def _find_layers(module: nn.Module) -> nn.ModuleList | None:
    for path in LAYOUTS:
        layers = module
        for attr in path.split("."):
            layers = getattr(layers, attr, None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            return layers
    return None


# A decoder's norm after its last layer: output_hidden_states reports the last state after it.
FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "decoder.final_layer_norm")


def _find_module(module: nn.Module, paths) -> nn.Module | None:
    for path in paths:
        found = module
        for attr in path.split("."):
            found = getattr(found, attr, None)
        if isinstance(found, nn.Module):
            return found
    return None


def is_causal_lm(config) -> bool:
    """A decoder-only language model (loaded with AutoModelForCausalLM, its LM head kept)."""
    if getattr(config, "is_encoder_decoder", False):
        return False
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in archs):
        return True
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES as masked)
    return not archs and config.model_type in causal and config.model_type not in masked


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position of each token among its row's real tokens: cumsum(mask) - 1 (0 on left padding)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class Backbone(nn.Module):
    """A frozen Hugging Face model with hooks on its embedding output and every layer."""

    runtime_name = "torch"  # the runtime whose states these are (a cache entry's key names any other)

    def __init__(self, model: nn.Module, tokenizer, name: str, states: str = "encoder"):
        super().__init__()
        self.model, self.tokenizer, self.name, self.states = model, tokenizer, name, states
        self.model.eval()
        self.model.requires_grad_(False)
        self.is_encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        self.is_causal = is_causal_lm(model.config)
        if self.is_encoder_decoder:
            core = model.get_decoder() if states == "decoder" else model.get_encoder()
        else:
            core = model.base_model
        layers = _find_layers(core)
        if layers is None:
            raise ModelError(f"{name}: cannot find the transformer layers of {type(model).__name__}")
        self.layers = layers
        self.final_norm = _find_module(core, FINAL_NORMS) if self.is_causal else None
        self.num_layers = len(layers) + 1  # embedding output counts as layer 0
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.hidden_size = int(getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
                               or config.d_model)
        self._fingerprint: str | None = None
        import inspect
        self._accepts = set(inspect.signature(model.forward).parameters)
        if self.is_causal and tokenizer is not None:
            if tokenizer.pad_token is None:  # GPT-2, Llama: pad with end-of-text (always masked out)
                tokenizer.pad_token = tokenizer.eos_token or tokenizer.bos_token
            tokenizer.padding_side = "left"  # what batched generation needs; positions follow the mask
        self.adds_bos = self.is_causal and prepends_bos(tokenizer)

    # --- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, name: str, states: str = "encoder", device: str | torch.device = "cpu") -> "Backbone":
        import transformers
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        from adalayers.progress import quiet_loading

        with quiet_loading():  # a GGUF base is converted here, the first time
            source = resolve(name)
        try:
            config = AutoConfig.from_pretrained(source)
            tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load base model {name!r} ({source}): {str(e).splitlines()[0]}") from None
        model_cls = AutoModel
        if is_causal_lm(config):
            model_cls = transformers.AutoModelForCausalLM
        for arch in getattr(config, "architectures", None) or []:
            # keep a base's own task head (e.g. ...ForSequenceClassification) so its output is served too
            if arch.endswith(("ForSequenceClassification", "ForTokenClassification")) and hasattr(transformers, arch):
                model_cls = getattr(transformers, arch)
        try:
            with quiet_loading():  # no "Loading weights" bars from the Python API either
                model = model_cls.from_pretrained(source)
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load base model {name!r} ({source}): {str(e).splitlines()[0]}") from None
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

    @contextlib.contextmanager
    def hooked(self, emit: Tap | None):
        """While open, every forward of the model calls emit(i, Z_i) for i = 0..num_layers-1, in order.

        0 is the embedding output (a pre-hook on the first layer), i the output of layer i; for a
        decoder with a final norm the last state is that norm's output, as output_hidden_states gives it.
        """
        handles = []

        def pre_hook(_module, args, kwargs):
            emit(0, args[0] if args else kwargs["hidden_states"])

        def make_hook(i):
            def hook(_module, _args, output):
                emit(i, output[0] if isinstance(output, (tuple, list)) else output)
            return hook

        if emit is not None:
            handles.append(self.layers[0].register_forward_pre_hook(pre_hook, with_kwargs=True))
            last = len(self.layers)
            for i, layer in enumerate(self.layers, start=1):
                if i < last or self.final_norm is None:
                    handles.append(layer.register_forward_hook(make_hook(i)))
            if self.final_norm is not None:
                handles.append(self.final_norm.register_forward_hook(make_hook(last)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def call_tapped(self, call: Callable[[], object], emit: Tap | None, stop_after: int | None = None):
        """call() (one forward of self.model) with emit(i, Z_i) hooked on its layers (hooked). stop_after=i
        ends the forward right after state i (early exit: the layers after it and any head on top, e.g. a
        decoder's LM head, are not run) -> None; else call()'s result."""
        def emit_then_stop(i, hidden):
            if emit is not None:
                emit(i, hidden)
            if i >= stop_after:
                raise _StopForward

        try:
            with self.hooked(emit if stop_after is None else emit_then_stop):
                return call()
        except _StopForward:
            return None

    @torch.no_grad()
    def forward(self, batch: dict, taps: list[Tap] = (), stop_after: int | None = None) -> BaseOutput:
        """Run the base; each tap sees (layer index, hidden state) as the layer computes it.

        stop_after=i stops the pass right after layer i (early exit; BaseOutput is then empty).
        """
        def emit(i, hidden):
            for tap in taps:
                tap(i, hidden)

        inputs = self.model_inputs(batch)
        if self.is_encoder_decoder:  # the main model runs whole: decoder fed the shifted input
            inputs.pop("token_type_ids", None)
            inputs["decoder_input_ids"] = self._decoder_inputs(inputs["input_ids"])
        out = self.call_tapped(lambda: self.model(**inputs), emit if taps else None, stop_after)
        if out is None:
            return BaseOutput(None, None, None)
        last = getattr(out, "last_hidden_state", None)
        if last is None and getattr(out, "encoder_last_hidden_state", None) is not None:
            last = out.encoder_last_hidden_state
        pooled = None
        if last is not None and last.shape[1] == inputs["attention_mask"].shape[1]:
            m = inputs["attention_mask"].unsqueeze(-1).to(last.dtype)
            pooled = (last * m).sum(1) / m.sum(1).clamp(min=1)
        return BaseOutput(last, pooled, getattr(out, "logits", None))

    def model_inputs(self, batch: dict) -> dict:
        """The batch's tensors the model takes; a decoder also gets position ids counted from the mask."""
        keys = ("input_ids", "attention_mask") + (("token_type_ids",) if "token_type_ids" in self._accepts else ())
        inputs = {k: batch[k].to(self.device) for k in keys if k in batch}
        if self.is_causal:
            if "position_ids" in self._accepts:
                inputs["position_ids"] = positions(inputs["attention_mask"])
            if "logits_to_keep" in self._accepts:
                inputs["logits_to_keep"] = 1  # next-token logits of the last position only, not (B, T, vocab)
        return inputs

    def _decoder_inputs(self, input_ids: torch.Tensor) -> torch.Tensor:
        start = self.model.config.decoder_start_token_id
        if start is None:
            start = self.model.config.pad_token_id or 0
        shifted = input_ids.new_full(input_ids.shape, self.model.config.pad_token_id or 0)
        shifted[:, 1:] = input_ids[:, :-1]
        shifted[:, 0] = start
        return shifted


def gguf_fingerprint(path: Path) -> str:
    """The default runtime's base fingerprint (Backbone.fingerprint) of a GGUF file: computed once from its
    conversion and kept beside it, so a runtime that runs the file as it is (llama.cpp) loads the same heads."""
    kept = gguf_models.kept_fingerprint(Path(path))
    if kept is not None:
        return kept
    folder = gguf_models.converted(Path(path))
    value = Backbone.load(str(folder), "decoder").fingerprint()
    atomic_write(folder / "fingerprint", value + "\n")
    return value
