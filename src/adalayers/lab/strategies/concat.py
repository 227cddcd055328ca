"""Head2Toe-style concatenation (Evci et al. 2022): every layer, normalised and mean-pooled over
tokens (kept per token for token tasks), concatenated, and one linear layer on top.

Optional group lasso: a penalty lambda * sum_j ||W[:, j]||_2 over input features j; with
keep_fraction < 1 the features with the largest group norms are kept and a fresh linear head is
trained on them alone (Head2Toe's two stages). The feature vector is num_layers * d wide and all
of it is held per example (per token for token tasks): that memory is reported.
"""
from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as nnf
from torch import nn

from adalayers.model.heads import masked_mean
from adalayers.lab.strategies.base import HarnessStrategy, save_run
from adalayers.engine import task_loss
from adalayers.lab.strategies.harness import OptimConfig, SharedPassModel, Trained, train_and_score
from adalayers.config import LR
from adalayers.kinds import TaskKind
from adalayers.settings import check, setting


class ConcatConfig(OptimConfig):
    lr: LR | None = setting(1e-3, "AdamW learning rate of the linear head.")
    group_lasso: float = setting(0.0, "Weight of the group-lasso penalty on the head's input features (0 = off).",
                                 ge=0)
    keep_fraction: Annotated[float, check(lambda v: 0 < v <= 1, "must be in (0, 1]")] = setting(
        1.0, "After training, keep this share of features (largest group norms) and train a fresh head on them; "
             "1 = no selection.")


class ConcatSide(nn.Module):
    def __init__(self, num_layers: int, hidden_size: int, kind: str, num_labels: int, group_lasso: float):
        super().__init__()
        self.kind, self.num_layers, self.d, self.group_lasso = kind, num_layers, hidden_size, group_lasso
        self.linear = nn.Linear(num_layers * hidden_size, 1 if kind == TaskKind.REGRESSION else num_labels)
        self.register_buffer("keep", torch.ones(num_layers * hidden_size))
        self._feats: list[torch.Tensor] = []

    def used_layers(self) -> list[int]:
        return list(range(self.num_layers))

    def begin(self) -> None:
        self._feats = []

    def tap(self, i: int, z: torch.Tensor) -> None:
        # a parameter-free LayerNorm per layer puts layers of different scales on one footing
        self._feats.append(nnf.layer_norm(z.to(self.linear.weight.dtype), (self.d,)))

    def end(self, mask: torch.Tensor) -> torch.Tensor:
        x = torch.cat(self._feats, dim=-1)            # (B, T, L*d)
        self._feats = []
        if self.kind != TaskKind.TOKENS:
            x = masked_mean(x, mask.to(x.device))    # (B, L*d)
        out = self.linear(x * self.keep)
        return out.squeeze(-1) if self.kind == TaskKind.REGRESSION else out

    def group_norms(self) -> torch.Tensor:
        return self.linear.weight.norm(dim=0)

    def loss(self, logits, labels):
        loss = task_loss(self.kind, logits, labels)
        if self.group_lasso:
            loss = loss + self.group_lasso * (self.group_norms() * self.keep).sum()
        return loss


class Concat(HarnessStrategy):
    Config = ConcatConfig

    def build(self, cfg, backbone, data):
        side = ConcatSide(backbone.num_layers, backbone.hidden_size, data.kind, max(len(data.labels), 1),
                          self.conf.group_lasso)
        self._model = SharedPassModel(backbone, side, data.kind, data.labels)  # stage 2 continues with it
        return self._model

    def train(self, cfg, backbone, data, encoded, out) -> Trained:
        if self.conf.keep_fraction >= 1:
            return super().train(cfg, backbone, data, encoded, out)
        # stage 1: train with the penalty; stage 2: keep the strongest features, fresh head, train again
        first = super().train(cfg, backbone, data, encoded, out)
        model = self._model
        side = model.side
        n_keep = max(1, int(round(self.conf.keep_fraction * side.keep.numel())))
        with torch.no_grad():
            keep = torch.zeros_like(side.keep)
            keep[side.group_norms().topk(n_keep).indices] = 1
            side.keep.copy_(keep)
            side.linear.reset_parameters()
        s = train_and_score(model, data, encoded, cfg, self.conf, out, backbone.device, f"{self.spec} (selected)")
        save_run(out, self, model, cfg, data, backbone)
        return Trained(s["results"], self.effective_params(model), first.train_seconds + s["train_seconds"],
                       first.epochs + s["epochs"], s["best_epoch"], model.infer,
                       {**self.extra(model), "stage1_validation": first.results.get("validation")})

    def effective_params(self, model) -> int:
        side = model.side
        kept = int(side.keep.sum().item())
        return kept * side.linear.out_features + side.linear.out_features

    def extra(self, model) -> dict:
        side = model.side
        width = side.keep.numel()
        unit = "token" if side.kind == TaskKind.TOKENS else "example"
        return {"feature_width": width, "features_kept": int(side.keep.sum().item()),
                f"feature_bytes_per_{unit}": width * 4,
                "memory_note": f"the head holds all {side.num_layers} layers' states of a batch at once "
                               f"({width} floats per {unit} after pooling)"}
