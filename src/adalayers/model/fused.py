"""Many heads, one GEMM per layer: every head's projection of layer i in a single matrix product.

For layer i and the heads h = 1..H whose weight w_i^(h) is not 0 (all of the same k and dtype):

    W_i   = [W_i^(1); ...; W_i^(H)]                          (H k, d)   concatenated once, cached
    P     = GELU(Z_i) W_i^T                                  (B, T, H k) one GEMM instead of H
    f     = LayerNorm_noaffine(P viewed as (B, T, H, k))     one call, normalises each head's k slice
    acc  += w_i[:, None] * f                                 one accumulator (B, T, H, k) for all heads

A probe's W_i is the identity (adalayers.model.heads.probe_projection): probes form groups of their own whose
f = LayerNorm_noaffine(GELU(Z_i)) needs no GEMM (a d x d identity product per probe was most of their cost).

Head h's accumulator is acc[..., h, :]; its SideTask's end() runs its head as before. This is
the arithmetic of each head's own tap (mixer.add) with the H products and normalisations
batched, so results equal the per-head path up to float summation order (the tests hold them to
1e-5; a token head's scores to 2e-4). f is adalayers.model.mixer.layer_features, the one place it is
computed. Heads of different k or dtype form separate groups. The same plan (`layer_plan`) and
step (`contribution`) build the exported ONNX graph (adalayers.export.graph). Each SideTask gets its
accumulator through its public `receive` and fixes its layer weights in `begin` (`pass_weights`).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from adalayers.model.mixer import activate, layer_features, normalize

_CACHE: "OrderedDict[tuple, tuple[list[torch.Tensor], list[int], torch.Tensor]]" = OrderedDict()
_CACHE_SIZE = 256
_IDENTITY: "OrderedDict[int, tuple[torch.Tensor, int, bool]]" = OrderedDict()  # is_identity's answers


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


def is_identity(weight: torch.Tensor) -> bool:
    """weight is the identity matrix (a probe's shared W_i, model.heads.probe_projection), remembered while the
    same tensor is unchanged (same _version): a decode step asks without comparing d x d values again."""
    w = weight.detach()
    if w.dim() != 2 or w.shape[0] != w.shape[1]:
        return False
    hit = _IDENTITY.get(id(weight))
    if hit is not None and hit[0] is weight and hit[1] == weight._version:
        return hit[2]
    same = torch.equal(w, torch.eye(len(w), dtype=w.dtype, device=w.device))
    _IDENTITY[id(weight)] = (weight, weight._version, same)  # holding the tensor keeps its id unique
    while len(_IDENTITY) > _CACHE_SIZE:
        _IDENTITY.popitem(last=False)
    return same


def group_heads(tasks: list) -> dict[tuple, list]:
    """Heads that can share one GEMM: same k, weight dtype and device, in the given order; probes (every W_i the
    identity) form groups of their own, which need no GEMM at all (normalized)."""
    groups: dict[tuple, list] = {}
    for t in tasks:
        w = t.mixer.proj[0].weight
        identity = all(is_identity(p.weight) for p in t.mixer.proj)
        groups.setdefault((t.mixer.k, w.dtype, w.device, identity), []).append(t)
    return groups


@dataclass
class LayerPlan:
    """Layer i for one group: which heads use it, their stacked W_i and their layer weights."""
    layer: int
    live: list[int]            # indices into the group of the heads with w_i != 0
    weight: torch.Tensor       # (len(live) k, d)
    w: torch.Tensor            # (len(live), 1)
    all_live: bool
    identity: bool = False     # every live W_i the identity (probes): f_i = LayerNorm_noaffine(GELU(Z_i)), no GEMM


def layer_plan(group: list, weights: torch.Tensor, i: int) -> LayerPlan | None:
    """weights: (H, L) layer weights of the group's heads (each head's layer_weights()). None: nobody uses i."""
    live = [h for h, w in enumerate(weights[:, i].tolist()) if w != 0]  # one read of the column, not one per head
    if not live:
        return None
    weight = [group[h].mixer.proj[i].weight for h in live]
    return LayerPlan(i, live, concat_weights(weight), weights[live, i].unsqueeze(-1), len(live) == len(group),
                     all(is_identity(w) for w in weight))


def normalized(a: torch.Tensor, plan: LayerPlan, k: int) -> torch.Tensor:
    """LayerNorm(GELU(Z_i) W_i^T) for the plan's heads: (..., len(live), k). `a` = GELU(Z_i). Identity W_i
    (probes): LayerNorm(GELU(Z_i)) once, a copy per live head."""
    if plan.identity:
        f = normalize(a, k)  # (..., 1, k): k is the base's width
        return f if len(plan.live) == 1 else f.expand(*f.shape[:-2], len(plan.live), k).contiguous()
    return layer_features(a, plan.weight, k)


def contribution(a: torch.Tensor, plan: LayerPlan, k: int) -> torch.Tensor:
    """w_i * LayerNorm(GELU(Z_i) W_i^T) for the plan's heads: (..., len(live), k). `a` = GELU(Z_i)."""
    f = normalized(a, plan, k)
    return f * plan.w.to(f.dtype)


def accumulate(acc: torch.Tensor | None, f: torch.Tensor, plan: LayerPlan, heads: int) -> torch.Tensor:
    """acc (..., H, k) += w_i * f at the plan's heads' slots, in place; f = normalized(...) is consumed.

    The first layer's weighted f becomes the accumulator itself when every head uses that layer
    (no zero fill, no add); after that, acc += f * w is one addcmul_ (no w * f temporary).
    """
    w = plan.w.to(f.dtype)
    if plan.all_live:
        return f.mul_(w) if acc is None else acc.addcmul_(f, w)
    if acc is None:
        acc = f.new_zeros(*f.shape[:-2], heads, f.shape[-1])
    return acc.index_add_(acc.dim() - 2, torch.tensor(plan.live, device=acc.device), f.mul_(w))


def all_layers(z: torch.Tensor, group: list, weights: torch.Tensor, layers: list[int], k: int,
               dtype: torch.dtype) -> torch.Tensor | None:
    """sum_i w_i^(h) LayerNorm(GELU(Z_i) W_i^(h)T) for every head h of a group and the layers i of `layers` at
    once: z (L, ..., d) holds Z_i for those layers, weights (H, L_all) -> (..., H, k); None: no head uses them.

    One GELU over all the layers, one batched product (L, N, d) x (L, d, H k) with the stacked
    [W_i^(1); ...; W_i^(H)], one LayerNorm, one weighted sum over the layers: the per-layer arithmetic of
    `normalized` and `accumulate` in a few calls (a decode step's states are small: the calls, not the
    arithmetic, cost). Layers no head of the group uses are left out; a head's w_i = 0 zeroes its part.
    """
    w = weights[:, layers]  # (H, L)
    used = [j for j, u in enumerate((w != 0).any(0).tolist()) if u]
    if not used:
        return None
    if len(used) < len(layers):
        z, w = z[used], w[:, used]
    a = activate(z, dtype).flatten(1, -2)  # (L, N, d)
    if all(is_identity(group[h].mixer.proj[layers[j]].weight) for j in used for h in range(len(group))):
        f = normalize(a, k)  # (L, N, 1, k): probes, no product; each head's weights pick its layer below
    else:
        stacked = concat_weights([group[h].mixer.proj[layers[j]].weight for j in used for h in range(len(group))])
        f = normalize(torch.bmm(a, stacked.view(len(used), -1, a.shape[-1]).transpose(1, 2)), k)  # (L, N, H, k)
    acc = (f * w.t().to(f.dtype)[:, None, :, None]).sum(0)
    return acc.view(*z.shape[1:-1], len(group), k)


class FusedTap:
    """tap(i, Z_i) for several SideTasks (after each one's begin()); their end() reads the result.

    For inference: no gradient is meant to flow through the shared accumulator, and projection
    dropout (a training-time option) is not applied. `defer`: a pass of at most that many token
    positions (a decode step) keeps its states until flush(), which runs every layer at once
    (all_layers); call flush() after such a pass, before the heads' end() or take().
    """

    def __init__(self, tasks: list, defer: int = 0) -> None:
        self.groups = group_heads(tasks)
        self.defer = defer
        self._acc: dict[tuple, torch.Tensor] = {}
        self._held: list[tuple[int, torch.Tensor]] = []
        self._weights = {key: torch.stack([t.pass_weights for t in group])  # (H, L)
                         for key, group in self.groups.items()}

    def flush(self) -> None:
        """The held states' contribution to every head's accumulator (nothing when none is held)."""
        if not self._held:
            return
        layers, z = [i for i, _ in self._held], torch.stack([z for _, z in self._held])
        self._held = []
        for key, group in self.groups.items():
            k, dtype = key[:2]
            acc = all_layers(z, group, self._weights[key], layers, k, dtype)
            if acc is not None:
                for h, t in enumerate(group):
                    t.receive(acc[..., h, :])

    def __call__(self, i: int, z: torch.Tensor) -> None:
        if z.shape[:-1].numel() <= self.defer:
            self._held.append((i, z.clone()))  # a copy: the base may reuse or change its buffer later in the pass
            return
        gelu: dict[torch.dtype, torch.Tensor] = {}
        for key, group in self.groups.items():
            plan = layer_plan(group, self._weights[key], i)
            if plan is None:
                continue
            k, dtype = key[:2]
            if dtype not in gelu:
                gelu[dtype] = activate(z, dtype)
            acc = self._acc.get(key)
            new = accumulate(acc, normalized(gelu[dtype], plan, k), plan, len(group))
            if acc is None:
                self._acc[key] = new
                for h, t in enumerate(group):
                    t.receive(new[..., h, :])  # a view: the in-place updates of later layers reach every head
