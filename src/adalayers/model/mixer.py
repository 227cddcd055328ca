"""AdaLayers: project every hidden layer to k dims, weight the layers, and sum.

    f_i     = LayerNorm_noaffine(GELU(Z_i) W_i^T)         W_i: d -> k, no bias
    weights = softmax(alpha * p); weights <= cutoff -> 0; renormalise       (p starts at 1: the uniform mix)
    training, layer_dropout q > 0: weights_i m_i / sum_j weights_j m_j,  m_i ~ Bernoulli(1 - q) per batch
    F       = sum_i weights_i * f_i                        (B, T, k)

F is accumulated one layer at a time (`add`), as the base computes: only one (B, T, k)
tensor is ever held, and layers whose weight is 0 are never projected.

`layer_features` is the one place f_i is computed, for one head or for several heads at once
(their W_i stacked): training (`add`), the fused serving path (adalayers.model.fused) and the
exported ONNX graph (adalayers.export.graph) all call it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as nnf
from torch import nn

from adalayers.config import MixerConfig
from adalayers.errors import ConfigError, ModelError
from adalayers.model import bf16
from adalayers.model.dropout import Dropout


def sinusoidal_positions(length: int, dim: int, device=None) -> torch.Tensor:
    """The Transformer's fixed sin/cos position table, (length, dim): columns sin_0, cos_0, sin_1, ..."""
    return position_table(torch.arange(length, device=device, dtype=torch.float32), dim)


def position_table(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """sin/cos rows for the positions `pos` (any shape) -> pos.shape + (dim,), without in-place slice assignment."""
    freq = torch.exp(torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    angles = pos.float().unsqueeze(-1) * freq
    return torch.stack([torch.sin(angles), torch.cos(angles)], -1).flatten(-2)[..., :dim]


def activate(z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """GELU(Z_i) in the projection's dtype (shared by every head that projects layer i)."""
    return nnf.gelu(z.to(dtype))


def project(a: torch.Tensor, weight: torch.Tensor, train_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a W^T, a = GELU(Z_i) (..., d), weight (H k, d): the stacked W_i of H heads -> (..., H k)."""
    return bf16.linear(a, weight, None, train_dtype)


def normalize(projected: torch.Tensor, k: int) -> torch.Tensor:
    """LayerNorm_noaffine over each head's k values: (..., H k) -> (..., H, k)."""
    return nnf.layer_norm(projected.unflatten(-1, (-1, k)), (k,))


def layer_features(a: torch.Tensor, weight: torch.Tensor, k: int,
                   train_dtype: torch.dtype | None = None) -> torch.Tensor:
    """f_i = LayerNorm_noaffine(GELU(Z_i) W_i^T) for H heads in one GEMM: a = GELU(Z_i) (activate),
    weight = [W_i^(1); ...; W_i^(H)] (H k, d) -> (..., H, k)."""
    return normalize(project(a, weight, train_dtype), k)


def drop_layers(w: torch.Tensor, q: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Layer dropout over a mixture (ELMo's / UDify's scalar mix): each layer is kept with probability
    1 - q, m_i ~ Bernoulli(1 - q), and the kept weights are renormalised,

        w'_i = w_i m_i / sum_j w_j m_j

    so the head sees a mix of a random subset of the layers and cannot lean on one layer's features alone.
    When no layer with weight > 0 survives, the largest weight is kept (w' = one-hot): a pass always
    mixes at least one layer. Without a cutoff, w' = softmax over the kept logits alone (UDify's -inf on
    the dropped logits): the dropped layers' logits get no gradient from that pass."""
    keep = torch.rand(w.shape, generator=generator, device=w.device) >= q
    kept = torch.where(keep, w, torch.zeros_like(w))
    if not bool((kept > 0).any()):
        keep = torch.zeros_like(keep)
        keep[int(torch.argmax(w))] = True
        kept = torch.where(keep, w, torch.zeros_like(w))
    return kept / kept.sum()


def middle_layer(num_layers: int) -> int:
    """The middle of the L states, (L-1)//2: near the best single layer on most cells measured (MiniLM 3 of 6,
    mpnet-base 6 of 12, Gemma 3 270M 9 of 18; docs/results.md), a prior that needs no sweep."""
    return (num_layers - 1) // 2


def mixed_up_to(num_layers: int, cfg: MixerConfig) -> int:
    """The deepest state the mixer may weigh: mixer.max_layer (checked against the base and the other layer
    settings), else the last."""
    top = cfg.max_layer
    if top is None:
        return num_layers - 1
    if top >= num_layers:
        raise ConfigError(f"mixer.max_layer: the base has layers 0..{num_layers - 1}, got {top}")
    for name in ("pin_layer", "init_layer"):
        at = getattr(cfg, name)
        if isinstance(at, int) and at > top:
            raise ConfigError(f"mixer.{name}: {at} is past mixer.max_layer ({top})")
    return top


def start_layer(num_layers: int, cfg: MixerConfig) -> int | None:
    """The layer a warm start favours (mixer.init_layer; 'middle' = middle_layer), or None."""
    if cfg.init_layer is None or cfg.pin_layer is not None:
        return None
    i = middle_layer(num_layers) if cfg.init_layer == "middle" else cfg.init_layer
    if not 0 <= i < num_layers:
        raise ConfigError(f"mixer.init_layer: the base has layers 0..{num_layers - 1}, got {i}")
    return i


def initial_logits(num_layers: int, cfg: MixerConfig) -> torch.Tensor:
    """p at the start: all ones (the uniform mix), or a warm start, softmax(alpha p) = s on layer
    mixer.init_layer and (1 - s) / (L - 1) on each other layer (s = mixer.init_share):

        p_i = 1 + log(w_i / w_min) / alpha,   w_min = the smallest starting weight
    """
    p = torch.ones(num_layers)
    i = start_layer(num_layers, cfg)
    if i is None or num_layers == 1:
        return p
    rest = (1 - cfg.init_share) / (num_layers - 1)
    if cfg.init_share <= 0 or rest <= cfg.cutoff:
        why = (f"at or below mixer.cutoff ({cfg.cutoff}), so they would be cut from the start" if rest <= cfg.cutoff
               else f"and layer {i} at 0")
        raise ConfigError(f"mixer.init_share: {cfg.init_share} starts the other {num_layers - 1} layers at {rest:.4f} "
                          f"each, {why}; give a share in (0, {1 - cfg.cutoff * (num_layers - 1):.3f})")
    w = torch.full((num_layers,), rest, dtype=torch.float64)
    w[i] = cfg.init_share
    return (1 + torch.log(w / w.min()) / cfg.alpha).float()


class AdaLayersMixer(nn.Module):
    train_dtype: torch.dtype | None = None  # the projections' dtype while training (train.head_precision; adalayers.model.bf16)

    def __init__(self, num_layers: int, hidden_size: int, cfg: MixerConfig):
        super().__init__()
        if cfg.pin_layer is not None and cfg.pin_layer >= num_layers:
            raise ConfigError(f"mixer.pin_layer: the base has layers 0..{num_layers - 1}, got {cfg.pin_layer}")
        top = mixed_up_to(num_layers, cfg)
        self.cfg = cfg
        self.num_layers, self.hidden_size, self.k = num_layers, hidden_size, cfg.k
        self.proj = nn.ModuleList(nn.Linear(hidden_size, cfg.k, bias=False) for _ in range(num_layers))
        self.p = nn.Parameter(initial_logits(num_layers, cfg))
        self.dropout = Dropout(cfg.dropout)
        pinned = torch.zeros(num_layers, dtype=torch.bool)
        pinned[top + 1:] = True  # past mixer.max_layer: p = -inf
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

    def learn_weights(self, on: bool) -> None:
        """Whether the mixing logits p learn (mixer.freeze_after turns them off between epochs)."""
        self.p.requires_grad_(on)

    def pass_weights(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """The weights one pass mixes with: layer_weights(), and in training with mixer.layer_dropout > 0
        a draw of drop_layers (a new one per batch)."""
        w = self.layer_weights()
        if self.training and self.cfg.layer_dropout > 0:
            w = drop_layers(w, self.cfg.layer_dropout, generator)
        return w

    def entropy(self, w: torch.Tensor | None = None) -> torch.Tensor:
        w = self.layer_weights() if w is None else w
        nz = w[w > 0]
        return -(nz * nz.log()).sum()

    def used_layers(self) -> list[int]:
        with torch.no_grad():
            return [i for i, x in enumerate(self.layer_weights().tolist()) if x > 0]

    # --- accumulation --------------------------------------------------------------------------
    def check_count(self, n: int) -> None:
        """All the layers at once must be all of them (as AllenNLP's ScalarMix checks)."""
        if n != self.num_layers:
            raise ModelError(f"the mixer expects {self.num_layers} hidden states (embeddings + "
                             f"{self.num_layers - 1} layers), got {n}")

    def check(self, i: int, z: torch.Tensor) -> None:
        """Layer i of the base this mixer was built for, of its width; else a one-line ModelError."""
        if not 0 <= i < self.num_layers:
            raise ModelError(f"the mixer mixes layers 0..{self.num_layers - 1} (embeddings + {self.num_layers - 1} "
                             f"layers), got layer {i}: the head was trained on a base with another depth")
        if z.shape[-1] != self.hidden_size:
            raise ModelError(f"the mixer expects hidden states of width {self.hidden_size}, got {z.shape[-1]} "
                             f"(layer {i}): the head was trained on a base of another width")

    def project(self, i: int, z: torch.Tensor) -> torch.Tensor:
        """GELU(Z_i) W_i^T, before normalisation: (..., k)."""
        weight = self.proj[i].weight
        return project(activate(z, weight.dtype), weight, bf16.training_dtype(self))

    def add(self, acc: torch.Tensor | None, i: int, z: torch.Tensor, w: torch.Tensor,
            projected: torch.Tensor | None = None) -> torch.Tensor | None:
        """acc + w_i * f_i; skips layers whose weight is 0 (no projection is computed for them).

        `projected` = GELU(Z_i) W_i^T (..., k) when the caller computed it already.
        """
        self.check(i, z)
        if w[i].item() == 0:  # cut off or pinned out: contributes nothing, gets no gradient
            return acc
        weight = self.proj[i].weight
        f = normalize(projected, self.k) if projected is not None else \
            layer_features(activate(z, weight.dtype), weight, self.k, bf16.training_dtype(self))  # (..., 1, k)
        term = f[..., 0, :] * w[i]
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
        self.check_count(len(hidden_states))
        w = self.pass_weights()
        acc = None
        for i, z in enumerate(hidden_states):
            acc = self.add(acc, i, z, w)
        return self.finish(acc)
