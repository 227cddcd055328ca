"""Many heads, one GEMM per layer: every head's projection of layer i in a single matrix product.

For layer i and the heads h = 1..H whose weight w_i^(h) is not 0 (all of the same k and dtype):

    C_i   = [C_i^(1); ...; C_i^(H)]                          (H k, d)   concatenated once, cached
            C^(h) = W^(h) - 1 mean_rows(W^(h))               each head's rows centred on their mean
    P     = GELU(Z_i) C_i^T                                  (B, T, H k) one GEMM instead of H
    f     = P / sqrt(mean_k(P^2) + eps)                      per head's k slice, = LayerNorm_noaffine
    acc  += w_i f                                            one accumulator (B, T, H, k) for all heads

Centring the rows of W^(h) centres its outputs: mean_k(x C^(h)T) = mean_k(x W^(h)T) - x mean_rows(W^(h))
= 0 for every x, so LayerNorm's mean subtraction is already in the weights and the normalisation is
one reduction (the root mean square) and one scale, which also carries w_i: acc += P * (w_i / rms)
is a single addcmul_. Head h's accumulator is acc[..., h, :]; its SideTask's end() runs its head as
before. Results equal each head's own tap (mixer.add: LayerNorm of GELU(Z_i) W_i^T) up to float
rounding (the tests hold them to 1e-5). Heads of different k or dtype form separate groups. The
same plan (`layer_plan`) and step (`contribution`) build the exported ONNX graph
(adalayers.export.graph).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as nnf

_CACHE: "OrderedDict[tuple, tuple[list[torch.Tensor], list[int], torch.Tensor]]" = OrderedDict()
_CACHE_SIZE = 256


def centred_weights(weights: list[torch.Tensor], k: int) -> torch.Tensor:
    """[W^(1); ...; W^(H)] (H k, d) with each head's k rows minus their mean, cached while the same
    tensors are unchanged (same _version)."""
    key = (k, *(id(w) for w in weights))
    versions = [w._version for w in weights]
    hit = _CACHE.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], weights)) and hit[1] == versions:
        _CACHE.move_to_end(key)
        return hit[2]
    w = torch.stack([w.detach() for w in weights])  # (H, k, d)
    cat = (w - w.mean(1, keepdim=True)).flatten(0, 1).contiguous()
    _CACHE[key] = (list(weights), versions, cat)  # holding the tensors keeps their ids unique
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return cat


def group_heads(tasks: list) -> dict[tuple, list]:
    """Heads that can share one GEMM: same k, weight dtype and device, in the given order."""
    groups: dict[tuple, list] = {}
    for t in tasks:
        w = t.mixer.proj[0].weight
        groups.setdefault((t.mixer.k, w.dtype, w.device), []).append(t)
    return groups


@dataclass
class LayerPlan:
    """Layer i for one group: which heads use it, their stacked W_i and their layer weights."""
    layer: int
    live: list[int]            # indices into the group of the heads with w_i != 0
    weight: torch.Tensor       # (len(live) k, d), each head's rows centred
    w: torch.Tensor            # (len(live), 1)
    all_live: bool


def layer_plan(group: list, weights: torch.Tensor, i: int) -> LayerPlan | None:
    """weights: (H, L) layer weights of the group's heads (each head's layer_weights()). None: nobody uses i."""
    live = [h for h in range(len(group)) if weights[h, i].item() != 0]
    if not live:
        return None
    return LayerPlan(i, live, centred_weights([group[h].mixer.proj[i].weight for h in live], group[0].mixer.k),
                     weights[live, i].unsqueeze(-1), len(live) == len(group))


EPS = 1e-5  # nn.functional.layer_norm's default, as in mixer.add


def projected(a: torch.Tensor, plan: LayerPlan, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """P = GELU(Z_i) C_i^T as (..., len(live), k) and 1 / sqrt(mean_k(P^2) + eps) as (..., len(live), 1).
    `a` = GELU(Z_i). P * the second = LayerNorm_noaffine(GELU(Z_i) W_i^T) for each plan's head.
    P keeps a's dtype under autocast too (a bf16 product of fp32 heads is normalised and summed in fp32,
    as layer_norm would), so the accumulator has the heads' dtype."""
    p = nnf.linear(a, plan.weight).to(a.dtype).unflatten(-1, (len(plan.live), k))
    return p, torch.linalg.vector_norm(p, dim=-1, keepdim=True).square_().div_(k).add_(EPS).rsqrt_()


def contribution(a: torch.Tensor, plan: LayerPlan, k: int) -> torch.Tensor:
    """w_i * LayerNorm(GELU(Z_i) W_i^T) for the plan's heads: (..., len(live), k). `a` = GELU(Z_i)."""
    p, inv = projected(a, plan, k)
    return p * (inv * plan.w.to(p.dtype))


def accumulate(acc: torch.Tensor | None, a: torch.Tensor, plan: LayerPlan, k: int, heads: int) -> torch.Tensor:
    """acc (..., H, k) += w_i * LayerNorm(GELU(Z_i) W_i^T) at the plan's heads' slots, in place. `a` = GELU(Z_i).

    The first layer's term becomes the accumulator itself when every head uses that layer (no zero
    fill, no add); after that, acc += P * (w / rms) is one addcmul_ (no normalised temporary).
    """
    p, scale = projected(a, plan, k)
    scale.mul_(plan.w.to(p.dtype))
    if plan.all_live:
        return p.mul_(scale) if acc is None else acc.addcmul_(p, scale)
    if acc is None:
        acc = p.new_zeros(*p.shape[:-2], heads, k)
    return acc.index_add_(acc.dim() - 2, torch.tensor(plan.live, device=acc.device), p.mul_(scale))


class FusedTap:
    """tap(i, Z_i) for several SideTasks (after each one's begin()); their end() reads the result.

    For inference: no gradient is meant to flow through the shared accumulator, and projection
    dropout (a training-time option) is not applied.
    """

    def __init__(self, tasks: list) -> None:
        self.groups = group_heads(tasks)
        self._acc: dict[tuple, torch.Tensor] = {}
        self._weights = {key: torch.stack([t._w for t in group]) for key, group in self.groups.items()}  # (H, L)

    def __call__(self, i: int, z: torch.Tensor) -> None:
        gelu: dict[torch.dtype, torch.Tensor] = {}
        for key, group in self.groups.items():
            plan = layer_plan(group, self._weights[key], i)
            if plan is None:
                continue
            k, dtype, _ = key
            if dtype not in gelu:
                gelu[dtype] = nnf.gelu(z.to(dtype))
            acc = self._acc.get(key)
            new = accumulate(acc, gelu[dtype], plan, k, len(group))
            if acc is None:
                self._acc[key] = new
                for h, t in enumerate(group):
                    t._acc = new[..., h, :]  # a view: the in-place updates of later layers reach every head
