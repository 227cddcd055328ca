"""One shared base, one head per task; a head may read upstream heads' outputs (progressive sharing).

The base is a deep copy of the loaded model (the original is never touched), pooled by the masked
mean of its last layer. Freezing: none (every weight but an unused pooler trains), top:N (only the
last N transformer layers), all (a frozen base: only the heads train).

Upstream outputs are computed on the downstream batch's own features: a one-side upstream head
(sentiment, linear) runs on each side, a two-side head (bilinear, cosine) on the pair and its
output goes to both sides. With freeze_upstream the upstream heads run with detached weights:
the downstream loss still reaches the base through them, but not their weights.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from adalayers.model.backbone import Backbone
from adalayers.errors import ConfigError
from adalayers.model.heads import masked_mean
from adalayers.lab.multitask import graph
from adalayers.lab.multitask.data import input_form
from adalayers.lab.multitask.heads import make_head
from adalayers.kinds import TaskKind


class MultitaskModel(nn.Module):
    def __init__(self, backbone: Backbone, specs, datas: dict, freeze: str = "none", freeze_upstream: bool = True):
        super().__init__()
        if backbone.is_encoder_decoder:
            raise ConfigError("multi-task training needs an encoder-only base (BERT-like)")
        self.model = copy.deepcopy(backbone.model)
        self.layers = Backbone(self.model, backbone.tokenizer, backbone.name).layers  # also freezes every weight
        self.pad_id = backbone.tokenizer.pad_token_id or 0
        self.freeze_upstream = freeze_upstream
        self._unfreeze(freeze)
        d = backbone.hidden_size
        self.deps = {s.name: list(s.depends_on) for s in specs}
        self.heads, self.forms = nn.ModuleDict(), {}
        widths = {}
        for name in graph.order(specs):
            s, data = next(s for s in specs if s.name == name), datas[name]
            n = max(len(data.labels), 1)
            if s.head == "bilinear" and len(data.labels) != 2:
                raise ConfigError(f"task {name}: a bilinear head needs two labels, {name} has {len(data.labels)}")
            if (s.head == "cosine") != (data.kind == TaskKind.REGRESSION) and s.head != "linear" \
                    or data.kind == TaskKind.TOKENS:
                raise ConfigError(f"task {name}: head {s.head} does not fit a {data.kind} task")
            d_in = d + sum(widths[u] for u in s.depends_on)
            head = make_head(s.head, d_in, n, s.hidden, s.dropout, data.kind == TaskKind.REGRESSION)
            for u in s.depends_on:
                if self.heads[u].sides == 2 and head.sides == 1:
                    raise ConfigError(f"task {name}: its {s.head} head reads one input and cannot take the "
                                      f"output of {u}'s two-input {type(self.heads[u]).__name__}")
            self.heads[name] = head
            widths[name] = head.output.width(n)
            self.forms[name] = input_form(head.sides, data.splits["train"][0].text_pair is not None, name)
        self.to(backbone.device)  # the heads beside the base (SMART's EMA copies them where they are)

    def _unfreeze(self, freeze: str) -> None:
        core = self.model.base_model
        if freeze == "none":
            pooler = getattr(core, "pooler", None)
            skip = {id(p) for p in pooler.parameters()} if isinstance(pooler, nn.Module) else set()
            for p in core.parameters():
                p.requires_grad_(id(p) not in skip)
        elif freeze.startswith("top:"):
            n = int(freeze[4:])
            if n > len(self.layers):
                raise ConfigError(f"freeze: {freeze}, but the base has only {len(self.layers)} layers")
            for layer in self.layers[len(self.layers) - n:]:
                layer.requires_grad_(True)

    def shared_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # --- the base ------------------------------------------------------------------------------
    def embed(self, side: dict) -> torch.Tensor:
        """Word embeddings of one side (what SMART perturbs); positions and types are added by the base."""
        return self.model.get_input_embeddings()(side["input_ids"].to(self.device))

    def encode(self, side: dict, embeds: torch.Tensor | None = None) -> torch.Tensor:
        dev = self.device
        inputs = {k: side[k].to(dev) for k in ("attention_mask", "token_type_ids") if k in side}
        h = self.model.base_model(inputs_embeds=self.embed(side) if embeds is None else embeds, **inputs).last_hidden_state
        return masked_mean(h, inputs["attention_mask"])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- heads ---------------------------------------------------------------------------------
    def head_output(self, name: str, ys: list[torch.Tensor], frozen: bool = False) -> torch.Tensor:
        head = self.heads[name]
        extras: list[list[torch.Tensor]] = [[] for _ in ys]
        for u in self.deps[name]:
            up, up_frozen = self.heads[u], frozen or self.freeze_upstream
            if up.sides == 1:
                for i, y in enumerate(ys):
                    extras[i].append(up.output.feature(self.head_output(u, [y], up_frozen)))
            else:
                f = up.output.feature(self.head_output(u, ys, up_frozen))
                for e in extras:
                    e.append(f)
        inputs = [torch.cat([y, *e], -1) for y, e in zip(ys, extras)]
        if frozen:
            return functional_call(head, {k: v.detach() for k, v in head.named_parameters()}, (inputs,))
        return head(inputs)

    def forward(self, name: str, batch: dict, embeds: list[torch.Tensor] | None = None) -> torch.Tensor:
        sides = batch["sides"]
        ys = [self.encode(s, None if embeds is None else embeds[i]) for i, s in enumerate(sides)]
        return self.head_output(name, ys)
