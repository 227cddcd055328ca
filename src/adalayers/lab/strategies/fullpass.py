"""A private copy of the base with a standard head: what fine-tuning and adapters train.

The shared base is deep-copied, never touched: its weights stay bit-identical, and its own
forward pass stays free of anything these strategies attach. Their price is a full pass of their
own per task. Standard head: sequence / regression tasks read the masked mean of the last layer
(the sentence embedding these bases were trained to give), token tasks every token;
optionally a hidden Linear(d, d) + tanh before the output layer.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from adalayers.model.backbone import Backbone
from adalayers.errors import ConfigError
from adalayers.model.heads import masked_mean
from adalayers.engine import task_loss, trainable
from adalayers.kinds import TaskKind


class StandardHead(nn.Module):
    def __init__(self, d: int, num_outputs: int, kind: str, dropout: float, tanh_hidden: bool = False):
        super().__init__()
        self.kind = kind
        self.hidden = nn.Sequential(nn.Linear(d, d), nn.Tanh()) if tanh_hidden else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d, num_outputs)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.kind != TaskKind.TOKENS:
            h = masked_mean(h, mask)
        out = self.out(self.dropout(self.hidden(h)))
        return out.squeeze(-1) if self.kind == TaskKind.REGRESSION else out


class FullPassModel(nn.Module):
    def __init__(self, backbone: Backbone, kind: str, labels: list[str], dropout: float, tanh_hidden: bool = False):
        super().__init__()
        if backbone.is_encoder_decoder and backbone.states == "decoder":
            raise ConfigError("fine-tuning and adapters read the encoder; set model.states: encoder")
        self.kind, self.labels = kind, list(labels)
        self.pad_id = backbone.tokenizer.pad_token_id or 0
        # Backbone() freezes every weight of the copy; strategies unfreeze what they train
        self.base = Backbone(copy.deepcopy(backbone.model), backbone.tokenizer, backbone.name, backbone.states)
        self.head = StandardHead(backbone.hidden_size, 1 if kind == TaskKind.REGRESSION else max(len(labels), 1),
                                 kind, dropout, tanh_hidden)

    def core(self) -> nn.Module:
        """The part of the base this model runs: the encoder stack (without a pooler or task head)."""
        m = self.base.model
        return m.get_encoder() if self.base.is_encoder_decoder else m.base_model

    def core_parameters(self):
        """Every weight of the core except a pooler, which the standard head does not read."""
        core = self.core()
        pooler = getattr(core, "pooler", None)
        skip = {id(p) for p in pooler.parameters()} if isinstance(pooler, nn.Module) else set()
        return [p for p in core.parameters() if id(p) not in skip]

    def forward(self, batch: dict) -> torch.Tensor:
        device = self.head.out.weight.device
        inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        if self.base.is_encoder_decoder:
            inputs.pop("token_type_ids", None)
        h = self.core()(**inputs).last_hidden_state
        return self.head(h, inputs["attention_mask"])

    def loss(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        return task_loss(self.kind, out, batch["labels"].to(out.device))

    def trainable_parameters(self) -> list[nn.Parameter]:
        return trainable(self)

    @torch.no_grad()
    def infer(self, batch: dict, n: int) -> None:
        """n tasks of this kind need n full passes (each task has its own weights)."""
        for _ in range(n):
            self(batch)
