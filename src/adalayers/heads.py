"""Task heads on the mixed features F (B, T, k).

sequence / regression: self-attention (padding masked) -> GELU -> dropout -> pooling (masked mean, masked max
                       the first or the last real token; head.pooling) -> linear
token:                 pre-LayerNorm transformer encoder layer(s) -> linear, per token (the feed-forward
                       over the real tokens only)
"""
from __future__ import annotations

import torch
import torch.nn.functional as nnf
from torch import nn

from adalayers.config import HeadConfig
from adalayers.kinds import TaskKind


def self_attention(attn: nn.MultiheadAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """attn(x, x, x, key_padding_mask=~mask) in one scaled_dot_product_attention call, same weights.

    nn.MultiheadAttention expands the padding mask to (B*heads, T, T) and falls back to the slow
    kernel: on CPU at T=512 that is ~4x slower and holds B*heads*T*T floats. A (B, 1, 1, T) mask
    keeps the fused kernel.
    """
    h, k = attn.num_heads, x.shape[-1]  # B and T are never read as numbers: an exported graph keeps them dynamic
    q, kk, v = (t.unflatten(-1, (h, k // h)).transpose(1, 2)
                for t in nnf.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, -1))
    out = nnf.scaled_dot_product_attention(q, kk, v, attn_mask=mask.bool()[:, None, None, :],
                                           dropout_p=attn.dropout if attn.training else 0.0)
    return attn.out_proj(out.transpose(1, 2).flatten(-2))


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
    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__()
        self.attn = nn.MultiheadAttention(k, cfg.num_heads, dropout=attention_dropout(cfg), batch_first=True)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(k, num_outputs)
        self.pooling = cfg.pooling

    def forward(self, F: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.dropout(nnf.gelu(self_attention(self.attn, F, mask)))
        return self.out(pool(x, mask, self.pooling))


class TokenHead(nn.Module):
    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__()
        layer = nn.TransformerEncoderLayer(k, cfg.num_heads, cfg.dim_feedforward, cfg.dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        layer.self_attn.dropout = attention_dropout(cfg)  # the layer's one dropout also sets the attention's
        self.encoder = nn.TransformerEncoder(layer, cfg.encoder_layers, enable_nested_tensor=False)
        self.out = nn.Linear(k, num_outputs)

    def forward(self, F: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each pre-LayerNorm layer, with the weights of nn.TransformerEncoderLayer (saved heads load as before):

            x = x + dropout(attention(LN1(x)))        padded (B, T, k); padding masked as keys
            x = x + dropout(FFN(LN2(x)))              on the real tokens only, packed (N, k)

        The feed-forward (2 * k * dim_feedforward multiply-adds a token) is most of the head's work, and
        a position-wise function: computing it for padding only produced values nothing reads (padding
        is never a key, its labels are ignored). Same values at every real token as
        nn.TransformerEncoder(F, src_key_padding_mask=~mask).
        """
        keep = mask.bool()
        x = F
        for layer in self.encoder.layers:
            x = x + layer.dropout1(self_attention(layer.self_attn, layer.norm1(x), keep))
            real = x[keep]
            x = x.masked_scatter(keep.unsqueeze(-1), real + layer._ff_block(layer.norm2(real)))
        return self.out(x)


def build_head(kind: str, k: int, num_labels: int, cfg: HeadConfig) -> nn.Module:
    if kind == TaskKind.TOKENS:
        return TokenHead(k, num_labels, cfg)
    return SequenceHead(k, 1 if kind == TaskKind.REGRESSION else num_labels, cfg)
