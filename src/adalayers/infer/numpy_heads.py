"""The heads' inference arithmetic in numpy: no torch in the process (the torch-free llama.cpp serving path);
the GELU compiled by numba (infer/gelu_kernel.py), every other step numpy's.

The same formulas as the torch modules they mirror (tests/test_numpy_heads.py holds them to 1e-4 on random
weights), for a trained head in eval mode (dropout is the identity):

    mixer      w = softmax(alpha p), pinned layers out, weights <= cutoff -> 0, renormalised   (AdaLayersMixer)
               f_i = LayerNorm_noaffine(GELU(Z_i) W_i^T);  F = sum_i w_i f_i
    read       F on the tokens the head sees (less BOS with skip_bos), GELU (gelu_after_sum), + sinusoidal
               positions counted over those tokens                                      (SideTask.read)
    sequence   self-attention (padding keys masked) -> GELU -> pooling -> linear        (SequenceHead)
    regression the sequence head, mean + std * out                                      (RegressionHead)
    token      pre-LayerNorm encoder layer(s) -> linear, per token                      (TokenHead)

The mixer's accumulators of many heads at once are infer/layer_mix.py's (LayerMix).
read_all runs the sequence heads of one shape as one: their projections stacked, one product per step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from adalayers.errors import ModelError

EPS = 1e-5  # torch's LayerNorm default, the mixer's and the token head's


def gelu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The exact GELU, x Phi(x) (torch's default, not the tanh approximation), as float32 (into `out` where given,
    best not x: gelu_kernel.gelu): compiled (infer/gelu_kernel.py, numba, imported at the first call: the torch path imports
    this module too)."""
    try:
        from adalayers.infer.gelu_kernel import gelu as compiled
    except ImportError:
        raise ModelError("the torch-free heads need numba for their GELU: pip install 'adalayers[llamacpp]'") from None
    return compiled(x, out)


class Scratch:
    """Float32 arrays whose memory is kept from call to call, for a decode step's arrays of a few hundred KB: freshly
    allocated each step they came back from malloc as new pages, and the page faults doubled the per-step sequence
    reads (3.4-4.3 ms against 1.6 ms a step, 8 sequences of 75 positions, three heads). Not thread-safe: one owner.

        buf = Scratch(2); a = buf.get(0, (H, k, n))   # array 0, valid until the next get(0, ...)
    """

    def __init__(self, count: int):
        self._flat = [np.empty(0, np.float32) for _ in range(count)]

    def get(self, j: int, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        if self._flat[j].size < size:
            self._flat[j] = np.empty(max(size, 2 * self._flat[j].size), np.float32)
        return self._flat[j][:size].reshape(shape)


def layer_norm(x: np.ndarray, weight: np.ndarray | None = None, bias: np.ndarray | None = None) -> np.ndarray:
    """Over the last axis, biased variance, eps 1e-5; without weight and bias: LayerNorm_noaffine."""
    mean = x.mean(-1, keepdims=True)
    c = x - mean
    y = c / np.sqrt((c * c).mean(-1, keepdims=True) + EPS)
    return y if weight is None else y * weight + bias


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def layer_weights(p: np.ndarray, alpha: float, cutoff: float, pin_layer: int | None,
                  max_layer: int | None = None) -> np.ndarray:
    """AdaLayersMixer.layer_weights: softmax(alpha p) (float32), pinned-out layers and layers past max_layer 0, the
    cutoff, renormalised."""
    logits = (np.float32(alpha) * p.astype(np.float32)).astype(np.float32)
    if max_layer is not None:
        logits = np.where(np.arange(len(p)) <= max_layer, logits, -np.inf).astype(np.float32)
    if pin_layer is not None:
        logits = np.where(np.arange(len(p)) == pin_layer, logits, -np.inf).astype(np.float32)
    w = softmax(logits).astype(np.float32)
    if cutoff > 0:
        w = np.where((w > np.float32(cutoff)) | (w == w.max()), w, np.float32(0))
        w = (w / w.sum()).astype(np.float32)
    return w


def position_table(pos: np.ndarray, dim: int) -> np.ndarray:
    """adalayers.model.mixer.position_table: sin/cos rows for the positions (any shape) -> pos.shape + (dim,)."""
    freq = np.exp(np.arange(0, dim, 2, dtype=np.float32) * np.float32(-math.log(10000.0) / dim))
    angles = pos.astype(np.float32)[..., None] * freq
    return np.stack([np.sin(angles), np.cos(angles)], -1).reshape(*pos.shape, -1)[..., :dim]


class PositionTable:
    """position_table's rows for positions 0..n-1, computed once and grown by doubling: table(pos) gives
    position_table(pos, dim), the same bits (each row is its position's alone), without a decode step's sin and cos
    (numpy_incremental: a new position a step)."""

    def __init__(self, dim: int):
        self.dim, self._rows = dim, np.zeros((0, dim), np.float32)

    def __call__(self, pos: np.ndarray) -> np.ndarray:
        top = int(pos.max()) + 1 if pos.size else 0
        if top > len(self._rows):
            self._rows = position_table(np.arange(max(top, 2 * len(self._rows), 256)), self.dim)
        return self._rows[pos]


# bytes of attention scores one product holds at most: the rows (B) go through in chunks below it (each row's
# attention is its own, so the result is the same). Unchunked, H stacked heads of n attention heads over B rows of
# T tokens hold H*B*n*T*T floats of scores, and copies of them (mask, softmax): 400 MB for 3 heads of 4 over a
# /predict micro-batch of 32 texts of 512 tokens.
SCORE_BYTES = 16 << 20


def attention(qkv: np.ndarray, keys: np.ndarray, num_heads: int) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v per attention head, keys (B, T) False masked: qkv (..., B, T, 3k) ->
    (..., B, T, k). A masked key gets the float32 minimum (a row without keys stays finite)."""
    *lead, b, t, three_k = qkv.shape
    rows = max(1, SCORE_BYTES // (4 * int(np.prod(lead, dtype=np.int64)) * num_heads * t * t))
    if b > rows:
        return np.concatenate([attention(qkv[..., i:i + rows, :, :], keys[i:i + rows], num_heads)
                               for i in range(0, b, rows)], axis=-3)
    k = three_k // 3
    split = qkv.reshape(*lead, b, t, 3, num_heads, k // num_heads)
    q, kk, v = (np.moveaxis(split[..., j, :, :], -2, -3) for j in range(3))  # (..., B, heads, T, d)
    scores = (q * np.float32((k // num_heads) ** -0.5)) @ np.swapaxes(kk, -1, -2)
    scores = np.where(keys[:, None, None, :], scores, np.finfo(np.float32).min)
    out = softmax(scores) @ v  # (..., B, heads, T, d)
    return np.moveaxis(out, -3, -2).reshape(*lead, b, t, k).astype(np.float32, copy=False)


def pool(x: np.ndarray, mask: np.ndarray, how: str) -> np.ndarray:
    """adalayers.model.heads.pool: (..., B, T, k) -> (..., B, k) over the real tokens."""
    m = mask[..., None]
    if how == "max":
        return np.where(m, x, np.finfo(np.float32).min).max(-2)
    if how in ("first", "last"):
        b = np.arange(mask.shape[0])
        col = mask.argmax(1) if how == "first" else mask.shape[1] - 1 - mask[:, ::-1].argmax(1)
        return x[..., b, col, :]
    return (x * m).sum(-2) / np.maximum(m.sum(-2), 1)


@dataclass
class SequenceHead:
    """SequenceHead / RegressionHead in eval mode. `scale`: regression's (mean, std), else None."""
    num_heads: int
    in_w: np.ndarray   # (3k, k)
    in_b: np.ndarray   # (3k,)
    out_proj_w: np.ndarray
    out_proj_b: np.ndarray
    out_w: np.ndarray  # (C, k)
    out_b: np.ndarray
    pooling: str
    scale: tuple[float, float] | None = None

    def shape_key(self) -> tuple:
        return (self.in_w.shape, self.num_heads)

    def output(self, pooled: np.ndarray) -> np.ndarray:
        return linear_output(pooled, self.out_w, self.out_b, self.scale)

    def __call__(self, F: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return sequence_heads([self], F[None], mask)[0]


def linear_output(pooled: np.ndarray, w: np.ndarray, b: np.ndarray, scale: tuple[float, float] | None) -> np.ndarray:
    """A head's output layer: class scores, or a regression's mean + std * y."""
    y = pooled @ w.T + b
    return y if scale is None else scale[0] + scale[1] * y[..., 0]


@dataclass
class ProbeHead:
    """head.type probe on a sequence task (ProbeHead / RegressionProbe): pool(F) -> linear."""
    out_w: np.ndarray  # (C, k)
    out_b: np.ndarray
    pooling: str
    scale: tuple[float, float] | None = None

    def __call__(self, F: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return linear_output(pool(F, mask, self.pooling), self.out_w, self.out_b, self.scale)


def sequence_heads(heads: list[SequenceHead], F: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """H sequence heads of one shape on F (H, B, T, k), one mask: each step one stacked product for all of them
    (adalayers.model.heads.sequence_heads), each head's own pooling and output layer."""
    n, b, t, k = F.shape
    w_in = np.stack([h.in_w.T for h in heads])                      # (H, k, 3k)
    qkv = np.matmul(F.reshape(n, b * t, k), w_in) + np.stack([h.in_b for h in heads])[:, None]
    o = attention(qkv.reshape(n, b, t, 3 * k), mask, heads[0].num_heads).reshape(n, b * t, k)
    x = gelu(np.matmul(o, np.stack([h.out_proj_w.T for h in heads])) + np.stack([h.out_proj_b for h in heads])[:, None])
    x = x.reshape(n, b, t, k)
    return [h.output(pool(x[j], mask, h.pooling)) for j, h in enumerate(heads)]


@dataclass
class EncoderLayer:
    """One pre-LayerNorm nn.TransformerEncoderLayer (GELU) in eval mode."""
    num_heads: int
    norm1: tuple[np.ndarray, np.ndarray]
    in_w: np.ndarray
    in_b: np.ndarray
    out_proj_w: np.ndarray
    out_proj_b: np.ndarray
    norm2: tuple[np.ndarray, np.ndarray]
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    def __call__(self, x: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """x: the real tokens' rows (N, k) in the order of keep (B, T)."""
        qkv = np.zeros((*keep.shape, self.in_w.shape[0]), np.float32)
        qkv[keep] = layer_norm(x, *self.norm1) @ self.in_w.T + self.in_b
        x = x + attention(qkv, keep, self.num_heads)[keep] @ self.out_proj_w.T + self.out_proj_b
        h = gelu(layer_norm(x, *self.norm2) @ self.w1.T + self.b1)
        return x + h @ self.w2.T + self.b2


@dataclass
class TokenHead:
    layers: list[EncoderLayer]
    out_w: np.ndarray
    out_b: np.ndarray

    def __call__(self, F: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(B, T, k) -> (B, T, C), zeros where mask is False."""
        x = F[mask]
        for layer in self.layers:
            x = layer(x, mask)
        out = np.zeros((*mask.shape, self.out_w.shape[0]), np.float32)
        out[mask] = x @ self.out_w.T + self.out_b
        return out


@dataclass
class Task:
    """A trained side task for inference: its layer weights, projections W_i and head (one of the above)."""
    kind: str
    labels: list[str]
    weights: np.ndarray                 # (L,) the mixer's layer weights
    proj: dict[int, np.ndarray]         # i -> W_i (k, d), the layers with w_i > 0
    head: SequenceHead | ProbeHead | TokenHead  # a token probe: a TokenHead without encoder layers
    skip_bos: bool = False
    positional: bool = True
    gelu_after_sum: bool = False
    members: list["Task"] = field(default_factory=list)  # a seed ensemble: its members answer, averaged

    @property
    def k(self) -> int:
        return next(iter(self.proj.values())).shape[0]

    def used_layers(self) -> list[int]:
        return sorted(self.proj)

    def layer_weights(self) -> np.ndarray:
        return self.weights

    def seen(self, mask: np.ndarray, skip_bos: bool | None = None) -> np.ndarray:
        """The tokens the head sees: the real ones, less each row's first with skip_bos."""
        mask = mask.astype(bool)
        if self.skip_bos if skip_bos is None else skip_bos:
            mask = mask & (np.cumsum(mask, 1) > 1)
        return mask

    def features(self, acc: np.ndarray, mask: np.ndarray, skip_bos: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
        """SideTask.features: F masked to the seen tokens, GELU (gelu_after_sum), + positions; (F, seen)."""
        seen = self.seen(mask, skip_bos)
        acc = np.where(seen[..., None], acc, np.float32(0))
        if self.gelu_after_sum:
            acc = gelu(acc)
        if self.positional:
            acc = acc + position_table(np.maximum(np.cumsum(seen, 1) - 1, 0), acc.shape[-1])
        return acc.astype(np.float32, copy=False), seen

    def read(self, acc: np.ndarray, mask: np.ndarray, skip_bos: bool | None = None) -> np.ndarray:
        """The head's logits (class scores; regression: the value) on F so far, acc (B, T, k), mask (B, T)."""
        return self.head(*self.features(acc, mask, skip_bos))


def probabilities(task: Task, logits: np.ndarray) -> np.ndarray:
    """What an answer shows: class probabilities (softmax), or a regression's value as it is."""
    return logits if task.kind == "regression" else softmax(logits.astype(np.float64)).astype(np.float32)


def read_all(tasks: list[Task], accs: list[np.ndarray], mask: np.ndarray, skip_bos: bool | None = None
             ) -> list[np.ndarray]:
    """[t.read(acc, mask) ...] with the sequence heads of one shape and the same reading of the mask run as one
    (sequence_heads). A seed ensemble's answer is log of its members' mean probabilities (regression: the
    mean value), as EnsembleTask's."""
    out: list[np.ndarray | None] = [None] * len(tasks)
    groups: dict[tuple, list[int]] = {}
    for j, t in enumerate(tasks):
        if isinstance(t.head, SequenceHead) and not t.members:
            key = (t.head.shape_key(), t.skip_bos, t.positional, t.gelu_after_sum, accs[j].shape)
            groups.setdefault(key, []).append(j)
        else:
            out[j] = _ensemble(t, accs[j], mask, skip_bos) if t.members else t.read(accs[j], mask, skip_bos)
    for members in groups.values():
        group = [tasks[j] for j in members]
        F, seen = group[0].features(np.stack([accs[j] for j in members]), mask, skip_bos)
        for j, y in zip(members, sequence_heads([t.head for t in group], F, seen)):
            out[j] = y
    return out


def _ensemble(task: Task, acc: np.ndarray, mask: np.ndarray, skip_bos: bool | None) -> np.ndarray:
    """acc (..., M k): the members' accumulators side by side (LayerMix feeds the members as heads)."""
    k = task.members[0].k
    outs = read_all(task.members, [acc[..., m * k:(m + 1) * k] for m in range(len(task.members))], mask, skip_bos)
    return ensemble_answer(task, outs)


def ensemble_answer(task: Task, outs: list[np.ndarray]) -> np.ndarray:
    """A seed ensemble's answer from its members' outputs (as EnsembleTask's)."""
    if task.kind == "regression":
        return np.mean(outs, 0)
    return np.log(np.mean([probabilities(task, o) for o in outs], 0))
