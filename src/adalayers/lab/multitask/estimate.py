"""How long a compare-multitask run will take: a few measured steps, scaled to the data. An estimate.

Fine-tuned variants: `probe_steps` of the trainer's own steps (trainer.Steps, with SMART, PCGrad's
per-task gradients and freezing) of each kind the schedule takes (one task's batch; every task's batch
at once for PCGrad's joint schedule) and one evaluation batch per task give seconds per step and per
evaluated row (a bi-encoded pair costs two passes); the schedule's own plan of an epoch says how many
steps of each kind there are:

    seconds ~ epochs * (sum over the epoch's steps of s_step + sum_t val_rows_t * s_eval_t) + sum_t test_rows_t * s_eval_t

Frozen-base (AdaLayers) variants: one base pass per row builds the hidden-state cache (when it is
not built yet), then each epoch runs only the heads:

    seconds ~ base_rows * s_base + max_epochs * sum_t (train_rows_t * s_head_train_t + val_rows_t * s_head_eval_t)

max_epochs is an upper bound: early stopping usually ends sooner; reading the cache adds a little.
The first measured step of each kind is a warm-up and is not counted.
"""
from __future__ import annotations

import time

import torch

from adalayers.lab.multitask import smart
from adalayers.lab.multitask.data import encode_rows
from adalayers.lab.multitask.model import MultitaskModel
from adalayers.lab.multitask.schedule import plan


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def _probe_rows(data, backbone, vcfg, form, split: str, n: int):
    return encode_rows(data.splits[split][:n], backbone.tokenizer, vcfg.max_length, form, data.kind, data.labels)


def finetune_costs(vcfg, backbone, datas: dict, probe_steps: int = 2) -> dict:
    """Seconds of one training step of each kind the variant's schedule takes, and per evaluated row of each task.

    The steps are the trainer's own (trainer.Steps: forward, backward with PCGrad's per-task gradients when on,
    the AdamW step, SMART's EMA update): a single-task step per task for round_robin / proportional, one
    step over every task at once for the joint schedule PCGrad uses.
    """
    from adalayers.lab.multitask import trainer

    model = MultitaskModel(backbone, vcfg.tasks, datas, vcfg.freeze, vcfg.freeze_upstream)
    bs, ebs = vcfg.batch_size, vcfg.eval_batch_size
    rows = {t: {"train": _probe_rows(d, backbone, vcfg, model.forms[t], "train", bs)} for t, d in datas.items()}
    ema = smart.EMA(model, vcfg.smart.beta) if vcfg.smart.enabled and vcfg.smart.mu else None
    steps = trainer.Steps(model, vcfg, rows, {s.name: s.weight for s in vcfg.tasks}, ema)
    opt = torch.optim.AdamW(steps.param_groups(), lr=vcfg.lr)

    def step(tasks: tuple[str, ...]):
        model.train()
        opt.zero_grad(set_to_none=True)
        steps.backward(steps({"steps": [(t, list(range(len(rows[t]["train"])))) for t in tasks]}))
        opt.step()
        steps.after_step()

    kind = trainer.schedule_kind(vcfg)
    shapes = [tuple(datas)] if kind == "joint" else [(t,) for t in datas]
    eval_row_s = {}
    for t, data in datas.items():
        val = _probe_rows(data, backbone, vcfg, model.forms[t], "validation", ebs)
        eval_row_s[t] = _timed(lambda: trainer.predict(model, t, val, ebs), 1) / len(val)
    return {"kind": kind, "batch_size": bs, "seed": vcfg.seed, "eval_row_s": eval_row_s,
            "step_s": {shape: _timed(lambda: step(shape), probe_steps) for shape in shapes}}


def adalayers_costs(mcfg, backbone, datas: dict, probe_steps: int = 2) -> dict:
    """Seconds per row: one base pass (the cache build), and a head's training / evaluation step."""
    from adalayers.data.encoding import batches, encode
    from adalayers.lab.multitask.adalayers import head_config
    from adalayers.recipes.service import resolve_head
    from adalayers.model.sidetask import SideTask

    costs = {}
    for t, data in datas.items():
        cfg = head_config(mcfg, t, 1, 1)
        resolve_head(cfg, data)
        task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, data.labels).to(backbone.device)
        opt = torch.optim.AdamW(task.parameters(), lr=cfg.train.lr)
        split = encode(data.splits["train"][:cfg.train.batch_size], backbone.tokenizer, mcfg.max_length, data.kind,
                       data.labels, "train")
        batch = next(iter(batches(split, cfg.train.batch_size, backbone.tokenizer.pad_token_id or 0)))
        states: list[torch.Tensor] = []
        n = len(split.rows)
        with torch.no_grad():
            base_s = _timed(lambda: (states.clear(), backbone(batch, taps=[lambda i, h: states.append(h)])), 1)
        mask, labels = batch["attention_mask"], batch["labels"]

        def step():
            task.train()
            opt.zero_grad(set_to_none=True)
            task.loss(task(states, mask), labels).backward()
            opt.step()

        def evaluate():
            task.eval()
            with torch.no_grad():
                task(states, mask)

        costs[t] = {"base_row_s": base_s / n, "head_train_row_s": _timed(step, probe_steps) / n,
                    "head_eval_row_s": _timed(evaluate, probe_steps) / n}
    return costs


def rows(datas: dict) -> dict:
    return {t: {s: len(ex) for s, ex in d.splits.items()} for t, d in datas.items()}


def finetune_seconds(costs: dict, sizes: dict, epochs: int) -> float:
    """epochs * (the schedule's steps of an epoch, each at its measured cost + the validation rows) + the test rows."""
    train = {t: n["train"] for t, n in sizes.items()}
    epoch_steps = plan(costs["kind"], train, costs["batch_size"], costs["seed"])
    step_s = sum(costs["step_s"][tuple(t for t, _ in step)] for step in epoch_steps)
    evaluate = sum(sizes[t].get("validation", 0) * s for t, s in costs["eval_row_s"].items())
    test = sum(sizes[t].get("test", 0) * s for t, s in costs["eval_row_s"].items())
    return epochs * (step_s + evaluate) + test


def adalayers_seconds(costs: dict, sizes: dict, max_epochs: int, cache_built: bool) -> float:
    base = 0.0 if cache_built else sum(sum(sizes[t].values()) * c["base_row_s"] for t, c in costs.items())
    return base + sum(max_epochs * (sizes[t]["train"] * c["head_train_row_s"]
                                    + sizes[t].get("validation", 0) * c["head_eval_row_s"])
                      for t, c in costs.items())
