"""Task heads on the mixed features F (B, T, k).

sequence / regression: self-attention (padding masked) -> GELU -> dropout -> masked mean -> linear
token:                 pre-LayerNorm transformer encoder layer(s) -> linear, per token
"""
from __future__ import annotations

import torch
import torch.nn.functional as nnf
from torch import nn

from adalayers.config import HeadConfig


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


class SequenceHead(nn.Module):
    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__()
        self.attn = nn.MultiheadAttention(k, cfg.num_heads, dropout=cfg.dropout, batch_first=True)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(k, num_outputs)

    def forward(self, F: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x, _ = self.attn(F, F, F, key_padding_mask=~mask.bool(), need_weights=False)
        x = self.dropout(nnf.gelu(x))
        return self.out(masked_mean(x, mask))


class TokenHead(nn.Module):
    def __init__(self, k: int, num_outputs: int, cfg: HeadConfig):
        super().__init__()
        layer = nn.TransformerEncoderLayer(k, cfg.num_heads, cfg.dim_feedforward, cfg.dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.encoder_layers, enable_nested_tensor=False)
        self.out = nn.Linear(k, num_outputs)

    def forward(self, F: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.out(self.encoder(F, src_key_padding_mask=~mask.bool()))


def build_head(kind: str, k: int, num_labels: int, cfg: HeadConfig) -> nn.Module:
    if kind == "token":
        return TokenHead(k, num_labels, cfg)
    return SequenceHead(k, 1 if kind == "regression" else num_labels, cfg)
