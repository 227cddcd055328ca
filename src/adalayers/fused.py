"""Many heads, one GEMM per layer: every head's projection of layer i in a single matrix product.

For layer i and the heads h = 1..H whose weight w_i^(h) is not 0 (all of the same k and dtype):

    W_i   = [W_i^(1); ...; W_i^(H)]                          (H k, d)   concatenated once, cached
    P     = GELU(Z_i) W_i^T                                  (B, T, H k) one GEMM instead of H
    f     = LayerNorm_noaffine(P viewed as (B, T, H, k))     one call, normalises each head's k slice
    acc  += w_i[:, None] * f                                 one accumulator (B, T, H, k) for all heads

Head h's accumulator is the view acc[..., h, :], handed to its SideTask, whose end() runs its
head as before. This is the arithmetic of each head's own tap (mixer.add) with the H products
and normalisations batched, so results equal the per-head path up to float summation order
(the tests hold them to 1e-5). Heads of different k or dtype form separate groups.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as nnf

_CACHE: "OrderedDict[tuple, tuple[list[torch.Tensor], list[int], torch.Tensor]]" = OrderedDict()
_CACHE_SIZE = 256


def concat_weights(weights: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(weights) (sum k, d), cached while the same tensors are unchanged (same _version)."""
    key = tuple(id(w) for w in weights)
    versions = [w._version for w in weights]
    hit = _CACHE.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], weights)) and hit[1] == versions:
        _CACHE.move_to_end(key)
        return hit[2]
    cat = torch.cat([w.detach() for w in weights], 0).contiguous()
    _CACHE[key] = (list(weights), versions, cat)  # holding the tensors keeps their ids unique
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return cat


class FusedTap:
    """tap(i, Z_i) for several SideTasks (after each one's begin()); their end() reads the result.

    For inference (no gradient flows into the heads through the shared accumulator); projection
    dropout, if configured, is not applied (eval mode has none).
    """

    def __init__(self, tasks: list) -> None:
        self.groups: dict[tuple, list] = {}
        for t in tasks:
            w = t.mixer.proj[0].weight
            self.groups.setdefault((t.mixer.k, w.dtype, w.device), []).append(t)
        self._acc: dict[tuple, torch.Tensor] = {}
        self._weights = {key: torch.stack([t._w for t in group]) for key, group in self.groups.items()}  # (H, L)

    def __call__(self, i: int, z: torch.Tensor) -> None:
        gelu: dict[torch.dtype, torch.Tensor] = {}
        for key, group in self.groups.items():
            k, dtype, _ = key
            w_all = self._weights[key][:, i]
            live = [h for h in range(len(group)) if w_all[h].item() != 0]
            if not live:
                continue
            if dtype not in gelu:
                gelu[dtype] = nnf.gelu(z.to(dtype))
            a = gelu[dtype]
            weight = concat_weights([group[h].mixer.proj[i].weight for h in live])
            f = nnf.layer_norm(nnf.linear(a, weight).unflatten(-1, (len(live), k)), (k,))
            acc = self._acc.get(key)
            if acc is None:
                acc = self._acc[key] = f.new_zeros(*f.shape[:-2], len(group), k)
                for h, t in enumerate(group):
                    t._acc = acc[..., h, :]  # a view: the in-place updates below reach every head
            w = w_all.to(f.dtype).unsqueeze(-1)
            if len(live) == len(group):
                acc.addcmul_(f, w)
            else:
                acc.index_add_(acc.dim() - 2, torch.tensor(live, device=acc.device), f * w[live])
