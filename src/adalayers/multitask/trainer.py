"""Train one multi-task config: load the tasks, build the model, run the schedule, keep the best epoch.

A step is one batch of one task (round_robin, proportional) or one batch of every task (PCGrad).
Each task's loss = weight * (head loss + SMART terms when on). The epoch with the best mean of the
tasks' main validation metrics is kept (its trainable tensors are held in memory).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from adalayers import metrics
from adalayers.config import Config
from adalayers.errors import AdaLayersError
from adalayers.multitask import heads as H
from adalayers.multitask import pcgrad, smart
from adalayers.multitask.data import batch_indices, collate, encode_rows
from adalayers.multitask.model import MultitaskModel
from adalayers.multitask.schedule import plan
from adalayers.tasks import load_task
from adalayers.train import seed_everything


def load_tasks(mcfg) -> dict:
    datas = {}
    for s in mcfg.tasks:
        cfg = Config()
        cfg.task.name, cfg.task.data_dir = s.name, mcfg.data_dir
        cfg.task.max_train_examples, cfg.task.max_eval_examples = mcfg.max_train_examples, mcfg.max_eval_examples
        datas[s.name] = load_task(cfg)
    return datas


def task_loss(model, name: str, batch: dict, mcfg, weight: float, ema) -> torch.Tensor:
    sc = mcfg.smart
    kind = model.kinds[name]
    if not sc.enabled:
        out = model(name, batch)
        return weight * H.loss(model.heads[name], out, batch["labels"].to(model.device))
    embeds = [model.embed(s) for s in batch["sides"]]
    out = model(name, batch, embeds)
    loss = H.loss(model.heads[name], out, batch["labels"].to(model.device))
    fn = lambda es: model(name, batch, es)  # noqa: E731
    loss = loss + sc.lambda_s * smart.smoothness(fn, embeds, out, kind, sc)
    if sc.mu:
        loss = loss + sc.mu * smart.bregman(ema, model, kind, out, name, batch)
    return weight * loss


@torch.no_grad()
def predict(model, name: str, rows, batch_size: int) -> list:
    model.eval()
    preds = []
    for idx in batch_indices(len(rows), batch_size):
        out = model(name, collate(rows, idx, model.pad_id)).float().cpu()
        kind = model.kinds[name]
        preds += out.argmax(-1).tolist() if kind == "classes" else (out > 0).long().tolist() if kind == "binary" \
            else out.tolist()
    return preds


def score(model, name: str, rows, data, batch_size: int) -> dict:
    preds = predict(model, name, rows, batch_size)
    if data.kind == "regression":
        return metrics.regression(rows.labels, preds)
    return metrics.classification(rows.labels, preds, data.labels)


def train(mcfg, backbone, datas: dict | None = None, log=print) -> dict:
    """Returns per-task validation/test metrics, trainable parameters, seconds and the epoch log."""
    seed_everything(mcfg.seed)
    datas = datas or load_tasks(mcfg)
    model = MultitaskModel(backbone, mcfg.tasks, datas, mcfg.freeze, mcfg.freeze_upstream)
    tok = backbone.tokenizer
    rows = {t: {split: encode_rows(ex, tok, mcfg.max_length, model.forms[t], datas[t].kind, datas[t].labels)
                for split, ex in datas[t].splits.items()} for t in datas}
    weights = {s.name: s.weight for s in mcfg.tasks}
    shared = model.shared_parameters()
    head_params = [p for p in model.heads.parameters()]
    groups = [{"params": head_params, "lr": mcfg.head_lr}] + ([{"params": shared, "lr": mcfg.lr}] if shared else [])
    opt = torch.optim.AdamW(groups, weight_decay=mcfg.weight_decay)
    params = shared + head_params
    ema = smart.EMA(model, mcfg.smart.beta) if mcfg.smart.enabled and mcfg.smart.mu else None
    sizes = {t: len(r["train"]) for t, r in rows.items()}
    kind = "joint" if mcfg.pcgrad else mcfg.schedule
    best, best_state, history = -math.inf, None, []
    t_start = time.perf_counter()
    for epoch in range(1, mcfg.epochs + 1):
        model.train()
        losses = {t: [] for t in rows}
        for step in plan(kind, sizes, mcfg.batch_size, mcfg.seed * 1000 + epoch):
            opt.zero_grad(set_to_none=True)
            task_grads = []
            for t, idx in step:
                loss = task_loss(model, t, collate(rows[t]["train"], idx, model.pad_id), mcfg, weights[t], ema)
                if not torch.isfinite(loss):
                    raise AdaLayersError(f"task {t}: the loss became {loss.item()} in epoch {epoch}")
                if mcfg.pcgrad and shared:
                    for p in shared:
                        p.grad = None
                loss.backward()
                if mcfg.pcgrad and shared:
                    task_grads.append(pcgrad.flat_grad(shared))
                losses[t].append(loss.item())
            if task_grads:
                pcgrad.assign(shared, pcgrad.combine(task_grads))
            if mcfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, mcfg.grad_clip)
            opt.step()
            if ema:
                ema.update(model)
        val = {t: score(model, t, rows[t]["validation"], datas[t], mcfg.eval_batch_size) for t in rows}
        mean = float(np.mean([val[t][datas[t].main_metric] for t in rows]))
        entry = {"epoch": epoch, "train_loss": {t: float(np.mean(v)) for t, v in losses.items() if v},
                 "validation": {t: datas[t].main_metric + f"={val[t][datas[t].main_metric]:.4f}" for t in rows},
                 "mean_main": mean, "seconds": round(time.perf_counter() - t_start, 1)}
        history.append(entry)
        log(f"  epoch {epoch}: {entry['validation']} mean {mean:.4f} ({entry['seconds']}s)")
        if mean > best:
            best = mean
            best_state = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    train_seconds = round(time.perf_counter() - t_start, 2)
    model.load_state_dict(best_state, strict=False)
    results = {t: {split: score(model, t, rows[t][split], datas[t], mcfg.eval_batch_size)
                   for split in ("validation", "test") if split in rows[t]} for t in rows}
    return {"results": results, "main_metric": {t: datas[t].main_metric for t in rows},
            "trainable_params": sum(p.numel() for p in params), "train_seconds": train_seconds,
            "best_epoch": 1 + int(np.argmax([h["mean_main"] for h in history])), "history": history,
            "forms": dict(model.forms)}
