"""Train one multi-task config: load the tasks, build the model, run the schedule, keep the best epoch.

A step is one batch of one task (round_robin, proportional) or one batch of every task (PCGrad).
Each task's loss = weight * (head loss + SMART terms when on). The epoch with the best mean of the
tasks' main validation metrics is kept (its trainable tensors are held in memory). The loop is the
one engine's (adalayers.engine.fit), in the precision of `precision`.
"""
from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from adalayers import metrics
from adalayers.config import Config
from adalayers.engine import FitSettings, count, fit
from adalayers.engine import predict as engine_predict
from adalayers.model.precision import autocast_for
from adalayers.lab.multitask import pcgrad, smart
from adalayers.engine.predict import in_order
from adalayers.lab.multitask.data import collate, encode_rows
from adalayers.lab.multitask.model import MultitaskModel
from adalayers.lab.multitask.schedule import plan
from adalayers.data.tasks import load_task
from adalayers.core import seed_everything
from adalayers.kinds import TaskKind

logger = logging.getLogger(__name__)


def load_tasks(mcfg) -> dict:
    datas = {}
    for s in mcfg.tasks:
        cfg = Config()
        cfg.task.name, cfg.task.data_dir = s.name, mcfg.data_dir
        cfg.task.max_train_examples, cfg.task.max_eval_examples = mcfg.train_rows(s.name), mcfg.max_eval_examples
        datas[s.name] = load_task(cfg)
    return datas


def task_loss(model, name: str, batch: dict, mcfg, weight: float, ema) -> torch.Tensor:
    sc = mcfg.smart
    output = model.heads[name].output
    if not sc.enabled:
        out = model(name, batch)
        return weight * output.loss(out, batch["labels"].to(model.device))
    embeds = [model.embed(s) for s in batch["sides"]]
    out = model(name, batch, embeds)
    loss = output.loss(out, batch["labels"].to(model.device))
    fn = lambda es: model(name, batch, es)  # noqa: E731
    loss = loss + sc.lambda_s * smart.smoothness(fn, embeds, out, output, sc)
    if sc.mu:
        loss = loss + sc.mu * smart.bregman(ema, model, output, out, name, batch)
    return weight * loss


def schedule_kind(mcfg) -> str:
    """The schedule a config trains with: PCGrad needs every task's gradient in one step (joint)."""
    return "joint" if mcfg.pcgrad else mcfg.schedule


class Steps(nn.Module):
    """The multi-task model as an adalayers.engine Trainable. A batch is one step of the schedule,
    {"steps": [(task, batch), ...]}; its outputs are the tasks' weighted losses (SMART's terms need
    the forward pass's own embeddings, so forward and loss are one computation per task, in order).

    With PCGrad, backward() takes each task's gradient of the shared parameters on its own and
    combines them (adalayers.lab.multitask.pcgrad); after every step the SMART EMA copy follows.
    """

    def __init__(self, model: MultitaskModel, mcfg, rows: dict, weights: dict, ema):
        super().__init__()
        self.model, self.mcfg, self.rows, self.weights, self.ema = model, mcfg, rows, weights, ema
        self.shared = model.shared_parameters()
        self.head_params = list(model.heads.parameters())
        self.losses: dict[str, list[float]] = {t: [] for t in rows}

    def forward(self, batch: dict) -> torch.Tensor:
        out = []
        for t, idx in batch["steps"]:
            loss = task_loss(self.model, t, collate(self.rows[t]["train"], idx, self.model.pad_id), self.mcfg,
                             self.weights[t], self.ema)
            self.losses[t].append(loss.item())
            out.append(loss)
        self._parts, self._stacked = out, torch.stack(out)
        return self._stacked

    def loss(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        return out

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.shared + self.head_params

    def param_groups(self) -> list[dict]:
        return [{"params": self.head_params, "lr": self.mcfg.head_lr}] + \
            ([{"params": self.shared, "lr": self.mcfg.lr}] if self.shared else [])

    def backward(self, losses: torch.Tensor) -> None:
        """`losses`: forward's stacked task losses, possibly scaled (fp16's GradScaler). Each task's backward
        starts from its own loss, not from an element of the stack: a backward through the stack would run
        every task's graph (with zero gradients) for each task."""
        pc = self.mcfg.pcgrad and self.shared
        if not pc:
            losses.sum().backward()
            return
        # the scale the engine applied (1 without a GradScaler), per task; a zero loss has nothing to scale
        plain = self._stacked.detach()
        scale = torch.where(plain != 0, losses.detach() / torch.where(plain != 0, plain, 1), 1)
        grads = []
        for i, part in enumerate(self._parts):
            for p in self.shared:
                p.grad = None
            (part * scale[i]).backward(retain_graph=i < len(self._parts) - 1)
            grads.append(pcgrad.flat_grad(self.shared))
        pcgrad.assign(self.shared, pcgrad.combine(grads))

    def after_step(self) -> None:
        if self.ema:
            self.ema.update(self.model)

    def epoch_losses(self) -> dict:
        out = {t: float(np.mean(v)) for t, v in self.losses.items() if v}
        self.losses = {t: [] for t in self.rows}
        return out


class OneTask(nn.Module):
    """One task's outputs of the multi-task model: forward(batch) = model(name, batch)."""

    def __init__(self, model: MultitaskModel, name: str):
        super().__init__()
        self.model, self.name = model, name

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(self.name, batch)


def predict(model, name: str, rows, batch_size: int, autocast=None) -> list:
    output = model.heads[name].output
    return engine_predict(OneTask(model, name), in_order(len(rows), batch_size),
                          lambda idx: collate(rows, idx, model.pad_id), len(rows), lambda out: output.predictions(out.cpu()),
                          autocast)


def score(model, name: str, rows, data, batch_size: int, autocast=None) -> dict:
    preds = predict(model, name, rows, batch_size, autocast)
    if data.kind == TaskKind.REGRESSION:
        return metrics.regression(rows.labels, preds)
    return metrics.classification(rows.labels, preds, data.labels)


class _Plan:
    """The schedule's steps of an epoch (adalayers.lab.multitask.schedule), as the engine's feed."""

    def __init__(self, kind: str, sizes: dict, mcfg, validate):
        self.kind, self.sizes, self.mcfg, self.validate = kind, sizes, mcfg, validate
        self.steps = len(plan(kind, sizes, mcfg.batch_size, mcfg.seed * 1000 + 1))

    def epoch(self, epoch: int, generator):
        for step in plan(self.kind, self.sizes, self.mcfg.batch_size, self.mcfg.seed * 1000 + epoch):
            yield {"steps": step}


def train(mcfg, backbone, datas: dict | None = None, log=None) -> dict:
    """Returns per-task validation/test metrics, trainable parameters, seconds and the epoch log."""
    log = log or logger.info
    seed_everything(mcfg.seed)
    datas = datas or load_tasks(mcfg)
    model = MultitaskModel(backbone, mcfg.tasks, datas, mcfg.freeze, mcfg.freeze_upstream)
    tok = backbone.tokenizer
    rows = {t: {split: encode_rows(ex, tok, mcfg.max_length, model.forms[t], datas[t].kind, datas[t].labels)
                for split, ex in datas[t].splits.items()} for t in datas}
    weights = {s.name: s.weight for s in mcfg.tasks}
    ema = smart.EMA(model, mcfg.smart.beta) if mcfg.smart.enabled and mcfg.smart.mu else None
    steps = Steps(model, mcfg, rows, weights, ema)
    device = backbone.device
    autocast = autocast_for(mcfg.precision, device)
    sizes = {t: len(r["train"]) for t, r in rows.items()}

    def validate(epoch: int) -> tuple[float, dict]:
        val = {t: score(model, t, rows[t]["validation"], datas[t], mcfg.eval_batch_size, autocast) for t in rows}
        mean = float(np.mean([val[t][datas[t].main_metric] for t in rows]))
        shown = {t: datas[t].main_metric + f"={val[t][datas[t].main_metric]:.4f}" for t in rows}
        log(f"  epoch {epoch}: {shown} mean {mean:.4f}")
        return mean, {"train_loss": steps.epoch_losses(), "validation": shown, "mean_main": mean}

    settings = FitSettings(lr=mcfg.lr, max_epochs=mcfg.max_epochs, weight_decay=mcfg.weight_decay,
                           grad_clip=mcfg.grad_clip, precision=mcfg.precision, seed=mcfg.seed, schedule="constant",
                           desc="multitask")
    summary = fit(steps, _Plan(schedule_kind(mcfg), sizes, mcfg, validate), settings,
                  device, keep_best=True)
    results = {t: {split: score(model, t, rows[t][split], datas[t], mcfg.eval_batch_size, autocast)
                   for split in ("validation", "test") if split in rows[t]} for t in rows}
    return {"results": results, "main_metric": {t: datas[t].main_metric for t in rows},
            "trainable_params": count(steps.trainable_parameters()), "train_seconds": summary["train_seconds"],
            "best_epoch": summary["best_epoch"], "history": summary["history"], "forms": dict(model.forms)}
