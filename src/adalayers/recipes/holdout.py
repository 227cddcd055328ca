"""Held-out mixing (mixer.holdout): the layer weights learn on rows the head never trains on.

A first-order bilevel split, as in DARTS: a share h of the training rows (drawn with train.seed) is held
out; on the other rows the projections and the head learn with the mixing logits p fixed, and on the
held-out rows only p learns:

    training step  on a batch of the kept rows      ->  W_i and the head step, p fixed
    mixing step    on a batch of the held-out rows  ->  p steps, W_i and the head fixed

Each epoch passes over the kept rows once; the mixing steps, spread evenly between the training steps, pass
over the held-out rows once (mixer.holdout_pace = "epoch": p takes h / (1 - h) as many steps as the rest) or
follow every training step (= "step": p steps as often as without a holdout, the held-out rows reshuffled
whenever they run out).

The reason it was tried: trained on the training loss, the weights follow the layers that lower it fastest
(on Gemma's QQP subset the embedding output and the last state, while the best single layer is 9); on
held-out rows a layer gains weight only by helping rows the head has not fitted. Measured (docs/results.md,
"Layer weights learned on held-out rows"), it moves the mix but does not beat the default: it stays an option.

Composes with the epoch schedule (adalayers.recipes.train.MixSchedule): an epoch in which p does not learn
has no mixing steps, one in which only p learns has no training steps. A pinned mixer has no mix to learn:
it trains on every row. The epoch's train_loss (log.jsonl) averages both kinds of steps.
"""
from __future__ import annotations

import torch

from adalayers.data.encoding import SplitFeed
from adalayers.errors import ConfigError


PACES = ("epoch", "step")


def holdout_rows(n: int, share: float, seed: int) -> tuple[list[int], list[int]]:
    """(kept rows, held-out rows) of n training rows: round(share * n) held out, drawn with `seed`; both
    sorted. A one-line ConfigError when either part would be empty."""
    held = round(share * n)
    if held < 1 or held >= n:
        raise ConfigError(f"mixer.holdout: {share} of {n} training rows holds out {held}; both the held-out and "
                          f"the kept part need at least one row")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[held:]), sorted(order[:held])


def interleave(train: int, mixing: int) -> list[bool]:
    """The order of an epoch's steps: True = a training step, False = a mixing step; `mixing` mixing steps
    spread evenly, each after the training steps that come before its share of the epoch."""
    order, done = [], 0
    for j in range(1, train + 1):
        order.append(True)
        while done < mixing * j // train:
            order.append(False)
            done += 1
    return order + [False] * (mixing - done)


class HeldOutMix:
    """The training feed of mixer.holdout: training batches of the kept rows and mixing batches of the
    held-out ones, interleaved, switching what learns before each batch is handed out (the engine runs a
    batch's step before it asks for the next)."""

    def __init__(self, inner, held: SplitFeed, task, pace: str = "epoch"):
        """`inner`: the feed of the kept rows (a SplitFeed, or MixSchedule around one); `held`: the feed of
        the held-out rows; `pace` (mixer.holdout_pace): "epoch" = each held-out row once an epoch, "step" = a
        mixing step after every training step, the held-out rows reshuffled whenever they run out."""
        if pace not in PACES:
            raise ConfigError(f"mixer.holdout_pace: must be one of {', '.join(PACES)}, got {pace!r}")
        self.inner, self.held, self.task, self.pace = inner, held, task, pace
        self.validate = inner.validate
        self.steps = inner.steps + self.mixing_steps(inner.steps)
        self.p = task.mixer.p
        self.rest = [q for q in task.trainable_parameters() if q is not self.p]

    @staticmethod
    def wanted(m) -> bool:
        return m.pin_layer is None and m.holdout > 0

    def mixing_steps(self, training_steps: int) -> int:
        return self.held.steps if self.pace == "epoch" else training_steps

    def _learn(self, logits: bool, rest: bool) -> None:
        self.task.mixer.learn_weights(logits)
        for q in self.rest:
            q.requires_grad_(rest)

    def _mixing(self, epoch: int, generator: torch.Generator):
        while True:  # the caller takes as many as the epoch's order asks for
            yield from self.held.epoch(epoch, generator)

    def epoch(self, epoch: int, generator: torch.Generator):
        batches = iter(self.inner.epoch(epoch, generator))  # sets what learns this epoch (MixSchedule)
        logits, rest = self.p.requires_grad, any(q.requires_grad for q in self.rest)
        mixing = self._mixing(epoch, generator)
        order = interleave(self.inner.steps if rest else 0, self.mixing_steps(self.inner.steps) if logits else 0)
        try:
            for training in order:
                source = batches if training else mixing
                self._learn(not training, training)
                yield next(source)
        finally:
            self._learn(logits, rest)
