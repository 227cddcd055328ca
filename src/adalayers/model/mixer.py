"""AdaLayers: project every hidden layer to k dims, weight the layers, and sum.

    f_i     = LayerNorm_noaffine(GELU(Z_i) W_i^T)         W_i: d -> k, no bias
    weights = softmax(alpha * p); weights <= cutoff -> 0; renormalise
    F       = sum_i weights_i * f_i                        (B, T, k)

F is accumulated one layer at a time (`add`), as the base computes: only one (B, T, k)
tensor is ever held, and layers whose weight is 0 are never projected.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as nnf
from torch import nn

from adalayers.model import bf16
from adalayers.config import MixerConfig
from adalayers.model.dropout import Dropout


def sinusoidal_positions(length: int, dim: int, device=None) -> torch.Tensor:
    """The Transformer's fixed sin/cos position table, (length, dim): columns sin_0, cos_0, sin_1, ..."""
    return position_table(torch.arange(length, device=device, dtype=torch.float32), dim)


def position_table(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """sin/cos rows for the positions `pos` (any shape) -> pos.shape + (dim,), without in-place slice assignment."""
    freq = torch.exp(torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    angles = pos.float().unsqueeze(-1) * freq
    return torch.stack([torch.sin(angles), torch.cos(angles)], -1).flatten(-2)[..., :dim]


class AdaLayersMixer(nn.Module):
    train_dtype: torch.dtype | None = None  # the projections' dtype while training (train.head_precision; adalayers.model.bf16)

    def __init__(self, num_layers: int, hidden_size: int, cfg: MixerConfig):
        super().__init__()
        if cfg.pin_layer is not None and cfg.pin_layer >= num_layers:
            from adalayers.errors import ConfigError
            raise ConfigError(f"mixer.pin_layer: the base has layers 0..{num_layers - 1}, got {cfg.pin_layer}")
        self.cfg = cfg
        self.num_layers, self.k = num_layers, cfg.k
        self.proj = nn.ModuleList(nn.Linear(hidden_size, cfg.k, bias=False) for _ in range(num_layers))
        self.p = nn.Parameter(torch.ones(num_layers))
        self.dropout = Dropout(cfg.dropout)
        pinned = torch.zeros(num_layers, dtype=torch.bool)
        if cfg.pin_layer is not None:
            pinned[:] = True
            pinned[cfg.pin_layer] = False  # all other layers get p = -inf
        self.register_buffer("masked_out", pinned, persistent=False)

    # --- the layer distribution ----------------------------------------------------------------
    def layer_weights(self) -> torch.Tensor:
        logits = (self.cfg.alpha * self.p).masked_fill(self.masked_out, float("-inf"))
        w = torch.softmax(logits, dim=0)
        if self.cfg.cutoff > 0:
            keep = (w > self.cfg.cutoff) | (w == w.max())  # the largest weight always survives
            w = torch.where(keep, w, torch.zeros_like(w))
            w = w / w.sum()
        return w

    def entropy(self, w: torch.Tensor | None = None) -> torch.Tensor:
        w = self.layer_weights() if w is None else w
        nz = w[w > 0]
        return -(nz * nz.log()).sum()

    def used_layers(self) -> list[int]:
        with torch.no_grad():
            return [i for i, x in enumerate(self.layer_weights().tolist()) if x > 0]

    # --- accumulation --------------------------------------------------------------------------
    def project(self, i: int, z: torch.Tensor) -> torch.Tensor:
        """GELU(Z_i) W_i^T, before normalisation."""
        w = self.proj[i].weight
        return bf16.linear(nnf.gelu(z.to(w.dtype)), w, None, bf16.training_dtype(self))

    def add(self, acc: torch.Tensor | None, i: int, z: torch.Tensor, w: torch.Tensor,
            projected: torch.Tensor | None = None) -> torch.Tensor | None:
        """acc + w_i * f_i; skips layers whose weight is 0 (no projection is computed for them).

        `projected` = project(i, z) when the caller computed it already (several heads in one GEMM).
        """
        if w[i].item() == 0:  # cut off or pinned out: contributes nothing, gets no gradient
            return acc
        # w_i * LayerNorm(.) in one kernel: w_i as the norm's (otherwise absent) scale, broadcast over k
        term = nnf.layer_norm(self.project(i, z) if projected is None else projected, (self.k,),
                              weight=w[i].expand(self.k))
        if self.cfg.projection_dropout:  # dropout(w_i f_i) = w_i dropout(f_i): the same draws, the same values
            term = self.dropout(term)
        return term if acc is None else acc + term

    def finish(self, acc: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """GELU (optional), + sinusoidal positions, dropout. `positions` (B, T): each token's position
        among its row's real tokens (left padding shifts them); None = 0..T-1 for every row. The table is
        computed from the positions themselves (no table of a fixed length), so an exported graph keeps T
        dynamic."""
        if self.cfg.gelu_after_sum:
            acc = nnf.gelu(acc)
        if self.cfg.positional:
            table = sinusoidal_positions(acc.shape[1], self.k, acc.device) if positions is None \
                else position_table(positions, self.k)
            acc = acc + table.to(acc.dtype)
        return self.dropout(acc)

    def forward(self, hidden_states: list[torch.Tensor]) -> torch.Tensor:
        """Convenience: mix a list of all layers' states at once (the accumulation path underneath)."""
        w = self.layer_weights()
        acc = None
        for i, z in enumerate(hidden_states):
            acc = self.add(acc, i, z, w)
        return self.finish(acc)
