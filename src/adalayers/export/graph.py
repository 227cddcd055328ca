"""The module that becomes the ONNX graph: base + every head, one pass.

    inputs   input_ids, attention_mask (B, T) [, token_type_ids]        B and T dynamic
    outputs  sentence_embedding (B, d)   masked mean of the last layer   (only with the primary output)
             <task>_logits               (B, C) sequence, (B, T, C) token, (B,) regression

The base runs with output_hidden_states (Z_0 = embedding output, Z_i = layer i's output, what
Backbone's taps see). Each layer some head uses is projected for all its heads with one GEMM
(adalayers.model.fused: the same plan and step the PyTorch serving path uses); the accumulated F of
each head goes through that head's SideTask.end(). Layers whose weight is 0 in every head are
never projected, so they are not in the graph; without the primary output the base itself is cut
after the deepest layer any head uses (its later layers are not in the graph either).
"""
from __future__ import annotations

import torch
from torch import nn

from adalayers.errors import ModelError
from adalayers.model.fused import LayerPlan, contribution, group_heads, layer_plan
from adalayers.model.heads import masked_mean
from adalayers.model.mixer import activate

EMBEDDING = "sentence_embedding"


def output_name(task: str) -> str:
    return f"{task}_logits"


def layer_owner(model: nn.Module, layers: nn.ModuleList) -> tuple[nn.Module, str]:
    """The module and attribute name that hold the base's layer list."""
    for module in model.modules():
        for attr in ("layer", "layers", "block"):
            if getattr(module, attr, None) is layers:
                return module, attr
    raise ModelError("cannot find the base's layer list to cut it")


class OnePassGraph(nn.Module):
    def __init__(self, backbone, names: list[str], tasks: list, primary: bool = True):
        super().__init__()
        if backbone.is_encoder_decoder or backbone.states != "encoder":
            raise ModelError(f"{backbone.name}: export supports encoder bases (BERT, RoBERTa, MPNet, ...)")
        if type(backbone.model).__name__.endswith(("ForSequenceClassification", "ForTokenClassification")):
            raise ModelError(f"{backbone.name}: export supports bases without their own task head")
        self.model, self.names, self.primary = backbone.model, list(names), primary
        self.tasks = nn.ModuleList(tasks)
        self.use_token_types = "token_type_ids" in backbone.tokenizer.model_input_names and \
            getattr(backbone.model.config, "type_vocab_size", 0) > 1
        used = set()
        self.plans: list[tuple[int, int, list[LayerPlan]]] = []  # (group id, k, plans)
        self.group_members: list[list[int]] = []
        for g, (key, group) in enumerate(group_heads(tasks).items()):
            weights = torch.stack([t.mixer.layer_weights().detach() for t in group])
            plans = [p for p in (layer_plan(group, weights, i) for i in range(backbone.num_layers)) if p]
            for p in plans:  # the stacked W_i and layer weights become the graph's initializers
                self.register_buffer(f"w{g}_{p.layer}", p.weight.clone())
                self.register_buffer(f"a{g}_{p.layer}", p.w.clone())
                used.add(p.layer)
            self.plans.append((g, key[0], plans))
            self.group_members.append([tasks.index(t) for t in group])
        self.used_layers = sorted(used)
        self.deepest = max(used)

    def input_names(self) -> list[str]:
        return ["input_ids", "attention_mask"] + (["token_type_ids"] if self.use_token_types else [])

    def output_names(self) -> list[str]:
        return ([EMBEDDING] if self.primary else []) + [output_name(n) for n in self.names]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        extra = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, **extra)
        states = out.hidden_states
        logits: list[torch.Tensor | None] = [None] * len(self.tasks)
        for (g, k, plans), members in zip(self.plans, self.group_members):
            accs: list[torch.Tensor | None] = [None] * len(members)  # one per head: no scatter in the graph
            for p in plans:
                plan = LayerPlan(p.layer, p.live, getattr(self, f"w{g}_{p.layer}"), getattr(self, f"a{g}_{p.layer}"),
                                 p.all_live, p.identity)
                c = contribution(activate(states[p.layer], plan.weight.dtype), plan, k)  # (B, T, live, k): one GEMM
                for j, h in enumerate(p.live):
                    accs[h] = c[..., j, :] if accs[h] is None else accs[h] + c[..., j, :]
            for h, m in enumerate(members):
                task = self.tasks[m]
                task.receive(accs[h])
                logits[m] = task.end(attention_mask)
        head_outputs = tuple(logits)
        if not self.primary:
            return head_outputs
        return (masked_mean(out.last_hidden_state, attention_mask),) + head_outputs
