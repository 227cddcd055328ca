"""How long a compare-multitask run will take: a few measured steps, scaled to the data. An estimate.

Fine-tuned variants: `probe_steps` training batches of every task through the variant's own loss
(SMART, PCGrad's per-task gradients and freezing included) and one evaluation batch per task give
seconds per training row and per evaluated row, per task (a bi-encoded pair costs two passes):

    seconds ~ epochs * sum_t (train_rows_t * s_train_t + val_rows_t * s_eval_t) + sum_t test_rows_t * s_eval_t

Frozen-base (AdaLayers) variants: one base pass per row builds the hidden-state cache (when it is
not built yet), then each epoch runs only the heads:

    seconds ~ base_rows * s_base + max_epochs * sum_t (train_rows_t * s_head_train_t + val_rows_t * s_head_eval_t)

max_epochs is an upper bound: early stopping usually ends sooner; reading the cache adds a little.
The first measured step of each kind is a warm-up and is not counted.
"""
from __future__ import annotations

import time

import torch

from adalayers.lab.multitask import pcgrad, smart
from adalayers.engine.predict import in_order
from adalayers.lab.multitask.data import collate, encode_rows
from adalayers.lab.multitask.model import MultitaskModel


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def finetune_costs(vcfg, backbone, datas: dict, probe_steps: int = 2) -> dict:
    """Seconds per training row and per evaluated row of each task for one fine-tuned variant."""
    from adalayers.lab.multitask import trainer

    model = MultitaskModel(backbone, vcfg.tasks, datas, vcfg.freeze, vcfg.freeze_upstream)
    shared = model.shared_parameters()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=vcfg.lr)
    ema = smart.EMA(model, vcfg.smart.beta) if vcfg.smart.enabled and vcfg.smart.mu else None
    bs, ebs, costs = vcfg.batch_size, vcfg.eval_batch_size, {}
    for t, data in datas.items():
        train = encode_rows(data.splits["train"][:bs], backbone.tokenizer, vcfg.max_length, model.forms[t],
                            data.kind, data.labels)
        val = encode_rows(data.splits["validation"][:ebs], backbone.tokenizer, vcfg.max_length, model.forms[t],
                          data.kind, data.labels)
        batch = collate(train, in_order(len(train), bs)[0], model.pad_id)

        def step():
            model.train()
            opt.zero_grad(set_to_none=True)
            trainer.task_loss(model, t, batch, vcfg, 1.0, ema).backward()
            if vcfg.pcgrad and shared:
                pcgrad.flat_grad(shared)
            opt.step()
            if ema:
                ema.update(model)

        costs[t] = {"train_row_s": _timed(step, probe_steps) / len(train),
                    "eval_row_s": _timed(lambda: trainer.predict(model, t, val, ebs), 1) / len(val)}
    return costs


def adalayers_costs(mcfg, backbone, datas: dict, probe_steps: int = 2) -> dict:
    """Seconds per row: one base pass (the cache build), and a head's training / evaluation step."""
    from adalayers.data.encoding import batches, encode
    from adalayers.lab.multitask.adalayers import head_config
    from adalayers.cli.recipes import resolve_head
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
    return sum(epochs * (sizes[t]["train"] * c["train_row_s"] + sizes[t].get("validation", 0) * c["eval_row_s"])
               + sizes[t].get("test", 0) * c["eval_row_s"] for t, c in costs.items())


def adalayers_seconds(costs: dict, sizes: dict, max_epochs: int, cache_built: bool) -> float:
    base = 0.0 if cache_built else sum(sum(sizes[t].values()) * c["base_row_s"] for t, c in costs.items())
    return base + sum(max_epochs * (sizes[t]["train"] * c["head_train_row_s"]
                                    + sizes[t].get("validation", 0) * c["head_eval_row_s"])
                      for t, c in costs.items())
