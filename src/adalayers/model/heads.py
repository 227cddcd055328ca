"""Task heads on the mixed features F (B, T, k), one registered builder per head kind (HEADS).

sequence / regression: self-attention (padding masked) -> GELU -> dropout -> pooling (masked mean, masked max
                       the first or the last real token; head.pooling) -> linear
token:                 pre-LayerNorm transformer encoder layer(s) -> linear, per token (the feed-forward
                       and projections over the real tokens only; dropout: adalayers.model.dropout)
regression:            the sequence head with one output, in the training targets' units:
                       mean + std * out (head.target_mean / target_std; the loss divides by std^2)
probe (head.type):     a linear probe, pool(F) -> linear (per token for token tasks) on one layer's features
                       (probe_projection); fitted by adalayers.recipes.probes, served as any head.
A new head kind is one class here and one line in HEADS (PROBES for head.type probe).
Serving several sequence / regression heads of one shape: sequence_heads runs their attention in one call
(SideTask's end_all groups them).
Training with train.head_precision=bf16, the attention projections and the feed-forward multiply in
bf16 (adalayers.model.bf16).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as nnf
from torch import nn

from adalayers.config import HeadConfig
from adalayers.errors import ConfigError
from adalayers.kinds import TaskKind
from adalayers.model import bf16
from adalayers.model.dropout import Dropout, dropout
from adalayers.model.fused import concat_weights


def self_attention(attn: nn.MultiheadAttention, x: torch.Tensor, mask: torch.Tensor,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """attn(x, x, x, key_padding_mask=~mask), same weights, without nn.MultiheadAttention's slow path;
    the projections' products in `dtype` (adalayers.model.bf16; None: fp32).

    nn.MultiheadAttention expands the padding mask to (B*heads, T, T) and falls back to the slow
    kernel: on CPU at T=512 that is ~4x slower and holds B*heads*T*T floats. Here a (B, 1, 1, T)
    mask keeps the fused kernel.
    """
    qkv = bf16.linear(x, attn.in_proj_weight, attn.in_proj_bias, dtype)
    return bf16.linear(attend(attn, qkv, mask), attn.out_proj.weight, attn.out_proj.bias, dtype)


def attend(attn: nn.MultiheadAttention, qkv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Projected (B, T, 3k) queries, keys and values -> (B, T, k) attention output before out_proj:
    each head's attention (below), padding keys masked, the heads' outputs side by side."""
    h, k = attn.num_heads, qkv.shape[-1] // 3  # B and T are never read as numbers: an exported graph keeps them dynamic
    q, kk, v = (t.unflatten(-1, (h, k // h)).transpose(1, 2) for t in qkv.chunk(3, -1))
    out = attention(q, kk, v, mask.bool()[:, None, None, :], attn.dropout if attn.training else 0.0)
    return out.transpose(1, 2).flatten(-2)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, p: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), keys masked) v, dropout p on the weights; q, k, v (..., T, d), `keys` a
    bool mask broadcastable to (..., T, T) (False: not a key).

    Without dropout, or off the CPU, one scaled_dot_product_attention call. Training with attention
    dropout on a CPU, the same formula written out, so the dropout mask is adalayers.model.dropout's cheap
    one: torch's own attention dropout draws a Mersenne-twister number per weight, which cost more than
    the attention.
    """
    if p and q.device.type == "cpu":
        scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
        weights = scores.masked_fill(~keys, torch.finfo(scores.dtype).min).softmax(-1)
        return dropout(weights, p) @ v
    return nnf.scaled_dot_product_attention(q, k, v, attn_mask=keys, dropout_p=p)


def unpack(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The real tokens' rows (N, c), in the order of x[keep], back to (B, T, c) with zeros on padding.

    index_copy, not masked_scatter: on a CPU masked_scatter's forward and backward take several times as long.
    """
    rows = keep.flatten().nonzero().squeeze(1)
    return values.new_zeros(keep.numel(), values.shape[-1]).index_copy(0, rows, values).view(*keep.shape, -1)


def length_groups(keep: torch.Tensor, group: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batch's rows sorted by length, `group` at a time: per group, (idx, real), both (G, T_g) with
    T_g the group's longest row. idx holds each real token's row in the packed order (N for padding),
    real says which are real. Any mask: right or left padding, holes, empty rows (skipped)."""
    n = int(keep.sum())
    rank = keep.flatten().cumsum(0).view(keep.shape) - 1   # each real token's row in the packed order
    lengths = keep.sum(1)
    cols = (~keep).to(torch.int8).argsort(dim=1, stable=True)  # per row: its real tokens' columns first, in order
    groups = []
    for rows in lengths.argsort(descending=True).split(group):
        t = int(lengths[rows].max())
        if t == 0:
            continue
        c = cols[rows, :t]
        real = keep[rows[:, None], c]
        groups.append((torch.where(real, rank[rows[:, None], c], n), real))
    return groups


def attend_packed(attn: nn.MultiheadAttention, qkv: torch.Tensor, keep: torch.Tensor,
                  groups: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
    """attend() on packed (N, 3k) q, k, v of the real tokens (keep: (B, T) mask) -> packed (N, k).

    groups=None: one call on the batch spread to (B, T, 3k). groups = length_groups(keep, G): the rows
    sorted by length and attended G at a time, each group padded only to its own longest row.
    Attention never mixes rows, so the values are the same; the work on padding is not: the score
    tensors are (heads, G, T_g, T_g) instead of (B, heads, T, T), and a shuffled batch's rows differ
    widely in length. The tokens are laid out heads first, (3, heads, N + 1, d) with row N zeros for
    a group's padding, so that one gather gives a group's q, k and v ready for the matrix products,
    and one index_copy puts every group's outputs back (padding onto row N, which is dropped).
    """
    if groups is None:
        return attend(attn, unpack(qkv, keep), keep)[keep]
    n, h = qkv.shape[0], attn.num_heads
    d = qkv.shape[1] // 3 // h
    by_head = torch.cat([qkv, qkv.new_zeros(1, qkv.shape[1])]).view(n + 1, 3, h, d).permute(1, 2, 0, 3).contiguous()
    p = attn.dropout if attn.training else 0.0
    outs, where = [], []
    for idx, real in groups:
        q, k, v = by_head[:, :, idx].unbind(0)  # (heads, G, T_g, d) each
        outs.append(attention(q, k, v, real[None, :, None, :], p).flatten(1, 2))  # (heads, G * T_g, d)
        where.append(idx.flatten())
    if not outs:
        return qkv.new_zeros(n, h * d)
    out = qkv.new_zeros(h, n + 1, d).index_copy(1, torch.cat(where), torch.cat(outs, 1))
    return out[:, :n].transpose(0, 1).flatten(1)


def attention_dropout(cfg: HeadConfig) -> float:
    return cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


def pool(x: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """(B, T, k) -> (B, k) over the real tokens: their mean, their elementwise max, the first token, or the last real one."""
    if how == "max":
        return x.masked_fill(~mask.bool().unsqueeze(-1), torch.finfo(x.dtype).min).amax(1)
    if how == "first":  # the first real token (left padding alike)
        return x[torch.arange(x.shape[0], device=x.device), mask.int().argmax(1)]
    if how == "last":
        return last_token(x, mask)
    return masked_mean(x, mask)


def last_token(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x at each row's last real position (left or right padding alike), (B, k)."""
    pos = torch.arange(mask.shape[1], device=mask.device)
    last = (mask.bool() * (pos + 1)).argmax(1)
    return x[torch.arange(x.shape[0], device=x.device), last]


class SequenceHead(nn.Module):
    train_dtype: torch.dtype | None = None  # the projections' dtype while training (train.head_precision)

    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__()
        self.attn = nn.MultiheadAttention(k, cfg.num_heads, dropout=attention_dropout(cfg), batch_first=True)
        self.dropout = Dropout(cfg.dropout)
        self.out = nn.Linear(k, num_outputs)
        self.pooling = cfg.pooling

    def forward(self, F: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.dropout(nnf.gelu(self_attention(self.attn, F, mask, bf16.training_dtype(self))))
        return self.output(pool(x, mask, self.pooling))

    def output(self, pooled: torch.Tensor) -> torch.Tensor:
        """The pooled (B, k) features -> the head's outputs (B, C)."""
        return self.out(pooled)


def sequence_heads(heads: list[SequenceHead], F: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """[heads[h](F[h], mask) for every h] in eval mode for H sequence (or regression) heads of the same k and
    number of attention heads, F (H, B, T, k): every step once for all of them, each head with its own weights,

        qkv_h = F_h W_in^(h)T + b_in^(h)                  one baddbmm, the H heads' W_in stacked (cached)
        o_h   = attention(q_h, k_h, v_h), padding masked   one scaled_dot_product_attention over (H B, heads, T, d)
        x_h   = GELU(o_h W_out^(h)T + b_out^(h))           one baddbmm, one GELU
        out_h = heads[h].output(pool(x_h, mask))           per head (its pooling and output layer)

    The same arithmetic as each head's forward (dropout is the identity in eval mode); results equal up
    to float summation order.
    """
    n, b, t, k = F.shape
    attn = [h.attn for h in heads]
    w_in = concat_weights([a.in_proj_weight for a in attn]).view(n, 3 * k, k)
    b_in = concat_weights([a.in_proj_bias for a in attn]).view(n, 1, 3 * k)
    qkv = torch.baddbmm(b_in, F.reshape(n, b * t, k), w_in.transpose(1, 2))  # (H, B T, 3k)
    q, kk, v = qkv.view(n * b, t, 3, attn[0].num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)  # (H B, heads, T, d)
    keys = mask.bool()[:, None, None, :].repeat(n, 1, 1, 1)
    o = attention(q, kk, v, keys, 0.0).transpose(1, 2).reshape(n, b * t, k)
    w_out = concat_weights([a.out_proj.weight for a in attn]).view(n, k, k)
    b_out = concat_weights([a.out_proj.bias for a in attn]).view(n, 1, k)
    x = nnf.gelu(torch.baddbmm(b_out, o, w_out.transpose(1, 2))).view(n, b, t, k)
    return [h.output(pool(x[j], mask, h.pooling)) for j, h in enumerate(heads)]


ATTENTION_GROUP = 8  # rows per attention call when a token head trains (length_groups)


class TokenHead(nn.Module):
    takes_packed = True  # forward() also takes F as the real tokens' rows (N, k) (SideTask.read_packed)
    train_dtype: torch.dtype | None = None  # the projections' and feed-forward's dtype while training (train.head_precision)

    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__()
        layer = nn.TransformerEncoderLayer(k, cfg.num_heads, cfg.dim_feedforward, cfg.dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        layer.self_attn.dropout = attention_dropout(cfg)  # the layer's one dropout also sets the attention's
        for name in ("dropout", "dropout1", "dropout2"):  # no state: saved heads load as before
            setattr(layer, name, Dropout(cfg.dropout))
        self.encoder = nn.TransformerEncoder(layer, cfg.encoder_layers, enable_nested_tensor=False)
        self.out = nn.Linear(k, num_outputs)

    def forward(self, F: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each pre-LayerNorm layer, with the weights of nn.TransformerEncoderLayer (saved heads load as before):

            x = x + dropout1(out_proj(attention(in_proj(LN1(x)))))     padding masked as keys
            x = x + dropout2(linear2(dropout(GELU(linear1(LN2(x))))))

        Everything but the attention itself is position-wise, so it runs on the real tokens only, packed
        (N, k): on padding it would only produce values nothing reads (padding is never a key, its labels
        are ignored). Only the projected q, k, v are spread out for the attention: in training, in groups
        of rows of similar length (attend_packed), in eval to (B, T, 3k) in one call. Same values
        at every real token as nn.TransformerEncoder(F, src_key_padding_mask=~mask); zeros on padding.
        regression:            the sequence head with one output, in the training targets' units:
                       mean + std * out (head.target_mean / target_std; the loss divides by std^2)
A new head kind is one class here and one line in HEADS.
Training with train.head_precision=bf16, in_proj, out_proj, linear1 and linear2 multiply in bf16
        (adalayers.model.bf16).
        """
        keep = mask.bool()
        x = F[keep] if F.dim() == 3 else F  # (N, k) already: the real tokens' rows, in the order of F[keep]
        # training: rows grouped by length once for every layer; eval: one call (an exported graph keeps B, T dynamic)
        groups = length_groups(keep, ATTENTION_GROUP) if self.training else None
        dt = bf16.training_dtype(self)  # train.head_precision: the products in bf16 while training
        for layer in self.encoder.layers:
            attn = layer.self_attn
            qkv = bf16.linear(layer.norm1(x), attn.in_proj_weight, attn.in_proj_bias, dt)
            x = x + layer.dropout1(bf16.linear(attend_packed(attn, qkv, keep, groups), attn.out_proj.weight,
                                               attn.out_proj.bias, dt))
            h = layer.dropout(layer.activation(bf16.linear(layer.norm2(x), layer.linear1.weight, layer.linear1.bias, dt)))
            x = x + layer.dropout2(bf16.linear(h, layer.linear2.weight, layer.linear2.bias, dt))
        return unpack(self.out(x), keep)


class RegressionHead(SequenceHead):
    """The sequence head with one output, given in the training targets' units (the same weights)."""

    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__(k, 1, cfg)
        self.cfg = cfg  # read when used: the recipe may set the targets' scale after building the head

    @property
    def loss_scale(self) -> float:
        """The MSE is taken in standard units: (pred - y)^2 / std^2."""
        return (self.cfg.target_std or 1.0) ** 2

    def output(self, pooled: torch.Tensor) -> torch.Tensor:
        return (self.cfg.target_mean or 0.0) + (self.cfg.target_std or 1.0) * super().output(pooled).squeeze(-1)


class ProbeHead(nn.Module):
    """head.type probe: a linear probe, pool(F) -> linear (classification logits), F one layer's features
    (the mixer pinned to one layer, identity projection: F = LayerNorm_noaffine(GELU(Z_i))). No attention,
    no dropout: what adalayers.recipes.probes fits with scikit-learn, its standardisation folded into `out`."""

    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__()
        self.out = nn.Linear(k, num_outputs)
        self.pooling = cfg.pooling

    def forward(self, F: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(pool(F, mask, self.pooling))

    def output(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.out(pooled)


class RegressionProbe(ProbeHead):
    """The probe with one output in the training targets' units: mean + std * linear(pool(F))."""

    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__(k, 1, cfg)
        self.cfg = cfg

    @property
    def loss_scale(self) -> float:
        return (self.cfg.target_std or 1.0) ** 2

    def output(self, pooled: torch.Tensor) -> torch.Tensor:
        return (self.cfg.target_mean or 0.0) + (self.cfg.target_std or 1.0) * self.out(pooled).squeeze(-1)


class TokenProbe(nn.Module):
    """The probe of a token task: one linear map per token, (B, T, k) -> (B, T, C), zeros on padding."""

    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__()
        self.out = nn.Linear(k, num_outputs)

    def forward(self, F: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.out(F) * mask.unsqueeze(-1).to(F.dtype)


HeadBuilder = Callable[[int, int, HeadConfig], nn.Module]  # (k, number of labels, head config) -> the head
HEADS: dict[TaskKind, HeadBuilder] = {  # one line per head kind
    TaskKind.CLASSIFICATION: SequenceHead,
    TaskKind.REGRESSION: RegressionHead,
    TaskKind.TOKENS: TokenHead,
}
PROBES: dict[TaskKind, HeadBuilder] = {  # head.type probe: one line per task kind
    TaskKind.CLASSIFICATION: ProbeHead,
    TaskKind.REGRESSION: RegressionProbe,
    TaskKind.TOKENS: TokenProbe,
}


def build_head(kind: str, k: int, num_labels: int, cfg: HeadConfig) -> nn.Module:
    """The registered head of `kind` (a TaskKind or one of its names); a probe with head.type probe."""
    kind = TaskKind.parse(kind, "head.kind")
    registry = PROBES if cfg.type == "probe" else HEADS
    if kind not in registry:
        raise ConfigError(f"head.kind: no head is registered for {kind.value!r} (registered: "
                          f"{', '.join(k.value for k in registry)})")
    return registry[kind](k, num_labels, cfg)


def probe_projection(mixer) -> None:
    """A probe's mixer (head.type probe): every layer's W_i is one shared identity matrix (k = the base's
    width), so F = LayerNorm_noaffine(GELU(Z_i)) of the pinned layer, and the run folder holds it once
    (named_parameters lists a shared tensor once; loading fills it for every layer)."""
    if mixer.k != mixer.hidden_size:
        raise ConfigError(f"head.type probe: mixer.k must be the base's width {mixer.hidden_size}, got {mixer.k}")
    shared = nn.Parameter(torch.eye(mixer.k))
    for proj in mixer.proj:
        proj.weight = shared
