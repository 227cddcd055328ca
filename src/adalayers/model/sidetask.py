"""One side task: the AdaLayers mixer plus a head, fed layer by layer during the base's pass.

    task.begin()             # once per batch: fix the layer weights, empty the accumulator
    task.tap(i, Z_i)         # called as layer i of the base is computed (or read from the cache:
                             # there, only the real tokens, Z_i[mask], when packed_ok)
    logits = task.end(mask)  # F -> head
"""
from __future__ import annotations

import torch
from torch import nn

from adalayers.config import Config
from adalayers.errors import ModelError
from adalayers.model import bf16
from adalayers.engine.loss import IGNORE, task_loss  # noqa: F401  (IGNORE: imported from here by older code)
from adalayers.engine.protocol import count, trainable
from adalayers.model.heads import SequenceHead, build_head, probe_projection, sequence_heads, unpack
from adalayers.kinds import TaskKind
from adalayers.model.mixer import AdaLayersMixer


class SideTask(nn.Module):
    def __init__(self, cfg: Config, num_layers: int, hidden_size: int, labels: list[str], bos: bool = False):
        """`bos`: the base's tokenizer puts a BOS token before every text (head.skip_bos=None follows it)."""
        super().__init__()
        self.skip_bos = bos if cfg.head.skip_bos is None else bool(cfg.head.skip_bos)
        # head.kind None means "the task's kind"; recipes.prepare fills it in, a bare Config() means sequence
        self.cfg, self.labels = cfg, list(labels)
        self.kind = TaskKind.parse(cfg.head.kind or TaskKind.CLASSIFICATION, "head.kind")
        self.mixer = AdaLayersMixer(num_layers, hidden_size, cfg.mixer)
        self.head = build_head(self.kind, cfg.mixer.k, max(len(labels), 1), cfg.head)
        if cfg.head.type == "probe":
            probe_projection(self.mixer)
        self.mixer.train_dtype = self.head.train_dtype = bf16.parse(cfg.train.head_precision)
        self._acc, self._w = None, None

    # --- streaming interface ----------------------------------------------------------------
    def begin(self) -> None:
        self._w = self.mixer.pass_weights()
        self._acc = None

    def tap(self, i: int, z: torch.Tensor, projected: torch.Tensor | None = None) -> None:
        with torch.set_grad_enabled(self.training):  # the base runs under no_grad; the mixer may train
            self._acc = self.mixer.add(self._acc, i, z, self._w, projected)

    @property
    def pass_weights(self) -> torch.Tensor:
        """The layer weights begin() fixed for this pass (L,)."""
        if self._w is None:
            raise ModelError("SideTask.pass_weights: call begin() first")
        return self._w

    def receive(self, acc: torch.Tensor) -> None:
        """Take this pass's accumulated F, (B, T, k) or packed (N, k), computed outside tap() (several heads'
        at once: adalayers.model.fused, adalayers.export.graph); end() then reads it."""
        self._acc = acc

    def uses(self, i: int) -> bool:
        """Does layer i count in this pass (call after begin())?"""
        return self._w[i].item() != 0

    @property
    def packed_ok(self) -> bool:
        """May tap() get only the real tokens, Z_i[mask] of shape (N, d), instead of (B, T, d)?

        The projection and LayerNorm act per token and a padding position's f_i only ever meets the
        mask, so skipping padding changes no result; a cache reads packed rows anyway. Not with
        projection dropout: its random draws would fall differently than on the padded tensor.
        """
        return not self.cfg.mixer.projection_dropout

    def end(self, mask: torch.Tensor) -> torch.Tensor:
        acc, mask = self._acc, mask.to(self._acc.device).bool()
        self._acc = None
        if getattr(self.head, "takes_packed", False):  # the cache's packed rows, or the live base's gathered:
            return self.read_packed(acc if acc.dim() == 2 else acc[mask], mask)  # one shape, one dropout draw
        if acc.dim() == 2:  # packed tokens (N, k): back to (B, T, k), zeros on padding
            acc = unpack(acc, mask)
        return self.read(acc, mask)

    def read_packed(self, acc: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """read() for the real tokens' rows (N, k), in the order of mask, and a head that takes them
        packed (the token head): the same values, without spreading F over the padding for the
        positions, the dropout and the head to skip again. The live base's padded F comes here too,
        gathered: its dropout then draws exactly what a cached run's does, so a run trains the same
        head from the cache as live (benchmarks/cache_speedup.py compares their test metrics)."""
        seen = self.seen(mask)
        if self.skip_bos:
            acc = acc[seen[mask]]
        positions = (seen.long().cumsum(1) - 1)[seen] if self.cfg.mixer.positional else None
        return self.head(self.mixer.finish(acc, positions), seen)

    def seen(self, mask: torch.Tensor, skip_bos: bool | None = None) -> torch.Tensor:
        """The tokens the head sees: the real ones, less each row's first with head.skip_bos."""
        mask = mask.bool()
        if self.skip_bos if skip_bos is None else skip_bos:
            mask = mask & (mask.long().cumsum(1) > 1)  # drop each row's first real token
        return mask

    def take(self) -> torch.Tensor | None:
        """The accumulator of the pass just tapped, (B, T, k), handed over and cleared (generation
        appends each decode step's positions to the prompt's)."""
        acc, self._acc = self._acc, None
        return acc

    def read(self, acc: torch.Tensor, mask: torch.Tensor, skip_bos: bool | None = None) -> torch.Tensor:
        """Accumulated F (B, T, k) + attention mask -> head output.

        The head sees the real tokens only, less the BOS token with head.skip_bos: padding and BOS
        rows of F are zeroed (a decoder's left padding may hold any value) and masked. Positions
        count the tokens the head sees, so a text's output does not depend on its batch's padding.
        skip_bos=None follows the config (False: the mask holds no BOS, e.g. a generated answer alone).
        """
        return self.head(*self.features(acc, mask, skip_bos))

    def features(self, acc: torch.Tensor, mask: torch.Tensor, skip_bos: bool | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """read()'s input to the head: (F, the mask of the tokens the head sees). acc (..., B, T, k): leading
        dimensions (several heads' accumulators stacked, end_all) share the mask and this mixer's finish()."""
        mask = self.seen(mask.to(acc.device), skip_bos)
        acc = acc.masked_fill(~mask.unsqueeze(-1), 0)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0) if self.cfg.mixer.positional else None
        return self.mixer.finish(acc, positions), mask

    def batch_key(self, acc: torch.Tensor | None = None) -> tuple | None:
        """Which other tasks' end() (or read() on `acc`) can run batched with this one's (end_all, read_all:
        heads.sequence_heads): the same key; None: never. Only in eval mode, for a sequence or regression head on
        a padded (B, T, k) accumulator (the pending one, or acc), and for SideTask's own end() and read() (a
        subclass that changes them runs on its own)."""
        acc = self._acc if acc is None else acc
        if self.training or type(self).end is not SideTask.end or type(self).read is not SideTask.read \
                or not isinstance(self.head, SequenceHead) or acc is None or acc.dim() != 3:
            return None
        m = self.cfg.mixer
        return (self.mixer.k, self.head.attn.num_heads, self.skip_bos, m.positional, m.gelu_after_sum,
                tuple(acc.shape), acc.dtype, acc.device, self.head.attn.in_proj_weight.dtype)

    @property
    def target_scale(self) -> tuple[float, float]:
        """Regression: (mean, std) of the training targets; the head's own output is in those units."""
        h = self.cfg.head
        return (h.target_mean or 0.0, h.target_std or 1.0)

    def forward(self, hidden_states: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        self.mixer.check_count(len(hidden_states))
        self.begin()
        for i, z in enumerate(hidden_states):
            self.tap(i, z)
        return self.end(mask)

    # --- what the trainer and the server need --------------------------------------------------
    def used_layers(self) -> list[int]:
        return self.mixer.used_layers()

    def layer_weights(self) -> torch.Tensor:
        """w_i of every layer (what /predict's description lists)."""
        return self.mixer.layer_weights()

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = task_loss(self.kind, logits, labels) / getattr(self.head, "loss_scale", 1.0)
        if self.cfg.mixer.entropy_lambda:
            loss = loss + self.cfg.mixer.entropy_lambda * self.mixer.entropy()
        return loss

    def trainable_parameters(self) -> list[nn.Parameter]:
        return trainable(self)

    def param_groups(self) -> list[dict]:
        """Optimiser groups: the mixing logits p at train.lr * mixer.logit_lr_scale, the rest at the
        optimiser's lr (train.lr); one group when the scale is 1."""
        params, scale = self.trainable_parameters(), self.cfg.mixer.logit_lr_scale
        logits = self.mixer.p
        if scale == 1 or not any(q is logits for q in params):
            return [{"params": params}]
        return [{"params": [q for q in params if q is not logits]},
                {"params": [logits], "lr": self.cfg.train.lr * scale}]

    def num_trainable(self) -> int:
        return count(self.trainable_parameters())


def shared_tap(tasks: list[SideTask], defer: int = 0):
    """One tap for several heads (after each one's begin()): GELU(Z_i) once per layer and one GEMM
    for every head's W_i (adalayers.model.fused); each head's end() then reads its own accumulator.
    defer > 0: passes of at most that many positions run all layers at once in tap.flush() (FusedTap)."""
    from adalayers.model.fused import FusedTap

    # an ensemble (adalayers.model.ensemble) taps through its members
    return FusedTap([m for t in tasks for m in getattr(t, "members", [t])], defer)


def end_all(tasks: list, mask: torch.Tensor) -> list[torch.Tensor]:
    """[t.end(mask) for t in tasks], the sequence and regression heads of the same shape (SideTask.batch_key)
    together: their accumulators stacked to (H, B, T, k), then one masking and finish() and one call per
    step of their heads (adalayers.model.heads.sequence_heads). Any other task runs its own end()."""
    keys = [t.batch_key() if isinstance(t, SideTask) else None for t in tasks]
    return _grouped(tasks, keys, lambda j: tasks[j].end(mask), lambda j: tasks[j].take(), mask, None)


def read_all(tasks: list, accs: list[torch.Tensor], mask: torch.Tensor, skip_bos: bool | None = None
             ) -> list[torch.Tensor]:
    """[t.read(acc, mask, skip_bos) for t, acc in zip(tasks, accs)] for accumulators the caller holds (generation
    keeps each head's F across decode steps), batched as end_all."""
    keys = [t.batch_key(a) if isinstance(t, SideTask) else None for t, a in zip(tasks, accs)]
    return _grouped(tasks, keys, lambda j: tasks[j].read(accs[j], mask, skip_bos), lambda j: accs[j], mask, skip_bos)


def _grouped(tasks: list, keys: list, alone, acc_of, mask: torch.Tensor, skip_bos: bool | None) -> list[torch.Tensor]:
    """Each task's output: alone(j) for a task without a partner of its key; else its group's accumulators
    acc_of(j) stacked, masked and finished once, and their heads run as one (heads.sequence_heads)."""
    groups: dict[tuple, list[int]] = {}
    for j, key in enumerate(keys):
        groups.setdefault(key if key is not None else ("alone", j), []).append(j)
    out: list[torch.Tensor | None] = [None] * len(tasks)
    for members in groups.values():
        if len(members) == 1:
            out[members[0]] = alone(members[0])
            continue
        group = [tasks[j] for j in members]
        F, seen = group[0].features(torch.stack([acc_of(j) for j in members]), mask, skip_bos)
        for j, y in zip(members, sequence_heads([t.head for t in group], F, seen)):
            out[j] = y
    return out


def over_states(tasks: list, states: list[torch.Tensor], mask: torch.Tensor, ends=end_all) -> list[torch.Tensor]:
    """Every task's output on stored states Z_0..Z_L of one batch (a base's hidden_states): each task's
    begin(), one shared_tap over the states in order, then ends(tasks, mask) (end_all, or each task's own end)."""
    for t in tasks:
        t.begin()
    tap = shared_tap(tasks)
    for i, z in enumerate(states):
        tap(i, z)
    return ends(tasks, mask)
