"""How every non-AdaLayers strategy is trained: through the one engine (adalayers.engine.fit).

A strategy hands it a model implementing adalayers.engine.Trainable: an nn.Module whose trainable
parameters are the ones with requires_grad, `forward(batch) -> logits`, `loss(out, batch)`, plus
`infer(batch, n)` (run n copies of the side task on one batch, for timing).

AdamW, a constant or linear-warmup-then-decay learning rate, selection of the best epoch on the
task's main validation metric (its trainable tensors are kept in memory), early stopping after
`train.early_stopping` epochs without improvement. Scoring is adalayers.recipes.evaluate's.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import torch
from torch import nn

from adalayers.config import LR, Fraction, WeightDecay
from adalayers.core import weights_digest
from adalayers.data.encoding import EncodedSplit, SplitFeed
from adalayers.engine import FitSettings, count, trainable, trainable_state  # noqa: F401  (trainable_state: for callers)
from adalayers.engine import fit as engine_fit
from adalayers.recipes.evaluate import evaluate_model
from adalayers.model.precision import autocast_for
from adalayers.model.states import LiveStates
from adalayers.settings import Section, setting

Schedule = Literal["constant", "linear"]


class OptimConfig(Section):
    """How the harness trains a strategy: a section of the one config tree (adalayers.settings), its
    optimiser fields the run config's types (adalayers.config.LR, WeightDecay, Fraction); each strategy's
    config extends it and re-annotates the defaults it changes (`lr: LR | None = 3e-4`)."""
    lr: LR | None = setting(None, "AdamW learning rate (None = train.lr of the run config).")
    weight_decay: WeightDecay = setting(0.0, "AdamW weight decay.")
    schedule: Schedule = setting("constant", "constant, or linear (warm up over warmup_fraction of the steps, "
                                             "then decay to 0).")
    warmup_fraction: Fraction = setting(0.1, "Share of all steps spent warming up (schedule=linear).")


@dataclass
class Trained:
    """What a strategy reports after training; `infer(batch, n)` runs n side tasks on one batch."""
    results: dict                       # {"validation": metrics, "test": metrics}
    trainable_params: int
    train_seconds: float
    epochs: int
    best_epoch: int
    infer: Callable[[dict, int], None]
    extra: dict = field(default_factory=dict)


def count_trainable(module: nn.Module) -> int:
    return count(trainable(module))


digest = weights_digest  # one weight hash for the whole project (adalayers.core)


# --- frozen-base strategies share the base's pass -------------------------------------------------

class SharedPassModel(nn.Module):
    """A side task fed by taps on the frozen base (begin / tap / end, like SideTask).

    The backbone is held outside the module tree, so .train() never switches the base's dropout
    on and .parameters() never lists its weights.
    """

    def __init__(self, backbone, side: nn.Module, kind: str, labels: list[str]):
        super().__init__()
        self.side, self.kind, self.labels = side, kind, list(labels)
        self.pad_id = backbone.tokenizer.pad_token_id or 0
        self._live = LiveStates(backbone)
        self._source = [self._live]  # a list: not registered as a submodule
        self._copies: list[nn.Module] = []

    def use_source(self, source) -> None:
        """Training and scoring read their hidden states from `source` (e.g. the cache); `infer`, which
        times the side task as it would serve, keeps running the live base."""
        self._source[0] = source

    def forward(self, batch: dict) -> torch.Tensor:
        self._source[0].run(batch, [self.side])
        return self.side.end(batch["attention_mask"])

    def loss(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        return self.side.loss(out, batch["labels"].to(out.device))

    def trainable_parameters(self) -> list[nn.Parameter]:
        return trainable(self)

    @torch.no_grad()
    def infer(self, batch: dict, n: int) -> None:
        run_shared(self._live, self.side, batch, n, self._copies)


@torch.no_grad()
def run_shared(source, side: nn.Module, batch: dict, n: int, cache: list) -> None:
    """n copies of a trained side task, all fed by one base pass."""
    while len(cache) < n:
        cache.append(copy.deepcopy(side).eval())
    tasks = cache[:n]
    source.run(batch, tasks)
    for t in tasks:
        t.end(batch["attention_mask"])


# --- training: the engine ------------------------------------------------------------------------

def evaluate(model, split: EncodedSplit, examples, batch_size: int, pad_id: int, autocast=None) -> dict:
    return evaluate_model(model, split, examples, batch_size, pad_id, autocast)[0]


def fit(model: nn.Module, data, encoded: dict, cfg, oc: OptimConfig, out: Path | None = None,
        device: torch.device | None = None, desc: str = "") -> dict:
    """Train `model` with adalayers.engine.fit, keep its best epoch on validation, restore it; returns a summary."""
    tc = cfg.train
    device = device or torch.device("cpu")
    autocast = autocast_for(tc.precision, device)

    def validate(epoch: int) -> tuple[float, dict]:
        val = evaluate(model, encoded["validation"], data.splits["validation"], tc.eval_batch_size, model.pad_id,
                       autocast)
        return val[data.main_metric], {"validation": _flat(val)}

    settings = FitSettings.of(tc, lr=oc.lr if oc.lr is not None else tc.lr, weight_decay=oc.weight_decay,
                              schedule=oc.schedule, warmup_fraction=oc.warmup_fraction, max_minutes=None, desc=desc)
    summary = engine_fit(model, SplitFeed(encoded["train"], tc.batch_size, model.pad_id, validate), settings,
                         device, run_dir=out, keep_best=True)
    return {k: v for k, v in summary.items() if k != "history"}


def train_and_score(model, data, encoded, cfg, oc: OptimConfig, out: Path | None, device, desc: str) -> dict:
    """fit + validation/test metrics with the selected epoch."""
    summary = fit(model, data, encoded, cfg, oc, out, device, desc)
    autocast = autocast_for(cfg.train.precision, device)
    results = {}
    for split in ("validation", "test"):
        if split in encoded:
            results[split] = evaluate(model, encoded[split], data.splits[split], cfg.train.eval_batch_size,
                                      model.pad_id, autocast)
    return {**summary, "results": results}


def _flat(m: dict) -> dict:
    return {k: v for k, v in m.items() if not isinstance(v, dict)}
