"""Linear probes on a frozen base's hidden states: the baselines an LLM-probing paper would report.

    python benchmarks/linear_probes.py configs/cola.yaml --base gemma3-270m

For a sequence-classification task, reads every layer's states of every split from the hidden-state
cache (the same entries `adalayers train` fills; built here if missing) and fits scikit-learn's
LogisticRegression on three kinds of features:

    mean   the mean over a text's real tokens (the BOS token left out when the tokenizer adds one)
    last   the last real token's state (a decoder's last token is the only one that read the whole text)
    concat the mean features of every layer side by side

For mean and last, one probe per layer; the layer is chosen on validation (the task's main metric) and
its test score reported. Features are standardised on the training split; C is chosen on validation
from a small grid. Writes benchmarks/results/probes_<task>_<base>.json with the settings, every
layer's validation and test score, and the chosen ones.
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path

import numpy as np
import torch

from adalayers import config, metrics
from adalayers.recipes import service
from adalayers.data.encoding import batch_plan, split_batch
from adalayers.kinds import TaskKind
from adalayers.store.run import write_json

HERE = Path(__file__).resolve().parent
log = logging.getLogger("linear_probes")


class Collector:
    """A 'task' for a states source: per layer, the mean-pooled and last-token states of each row."""

    packed_ok = False

    def __init__(self, layers: list[int], skip_bos: bool):
        self.layers, self.skip_bos = layers, skip_bos
        self.mask: torch.Tensor | None = None
        self.mean: dict[int, list[np.ndarray]] = {i: [] for i in layers}
        self.last: dict[int, list[np.ndarray]] = {i: [] for i in layers}

    def used_layers(self) -> set[int]:
        return set(self.layers)

    def begin(self) -> None:
        pass

    def tap(self, i: int, z: torch.Tensor) -> None:
        m = self.mask.to(z.dtype)
        if self.skip_bos:  # the first real token of each row is the BOS token
            first = self.mask.argmax(1)
            m = m.clone()
            m[torch.arange(len(m)), first] = 0
        pooled = (z * m.unsqueeze(-1)).sum(1) / m.sum(1, keepdim=True).clamp(min=1)
        last = (self.mask * torch.arange(self.mask.shape[1])).argmax(1)  # last real token (any padding side)
        self.mean[i].append(pooled.float().numpy())
        self.last[i].append(z[torch.arange(len(z)), last].float().numpy())


def features(source, split, layers: list[int], skip_bos: bool, batch_size: int, pad_id: int):
    col = Collector(layers, skip_bos)
    labels, order = [], []
    for idx in batch_plan(split, batch_size, shuffle=False):
        batch = split_batch(split, idx, pad_id)
        col.mask = batch["attention_mask"]
        with torch.no_grad():
            source.run(batch, [col])
        labels.append(batch["labels"].numpy())
        order += list(idx)
    back = np.argsort(order)  # rows in split order
    y = np.concatenate(labels)[back]
    mean = {i: np.concatenate(v)[back] for i, v in col.mean.items()}
    last = {i: np.concatenate(v)[back] for i, v in col.last.items()}
    return mean, last, y


def fit_probe(xtr, ytr, xva, yva, xte, yte, labels, main: str, positive, seed: int):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scale = StandardScaler().fit(xtr)
    xtr, xva, xte = scale.transform(xtr), scale.transform(xva), scale.transform(xte)
    best = None
    for c in (0.001, 0.01, 0.1, 1.0):
        clf = LogisticRegression(C=c, max_iter=2000, random_state=seed).fit(xtr, ytr)
        val = metrics.classification(yva.tolist(), clf.predict(xva).tolist(), labels, positive)[main]
        if best is None or val > best[0]:
            best = (val, c, clf)
    val, c, clf = best
    test = metrics.classification(yte.tolist(), clf.predict(xte).tolist(), labels, positive)[main]
    return {"C": c, "validation": val, "test": test}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--metric", help="main metric (default: mcc for cola, accuracy otherwise)")
    ap.add_argument("--tag", default="", help="appended to the result's name: probes_<task>_<base><tag>.json")
    args = ap.parse_args()
    cfg = config.load(args.config, [f"model.base={args.base}", *args.overrides])
    backbone, data, encoded = service.prepare(cfg)
    if data.kind != TaskKind.CLASSIFICATION:
        raise SystemExit(f"linear_probes: {data.name} is a {data.kind} task; probes here are for classification")
    source = service.make_source(cfg, backbone, data, encoded)
    skip_bos = backbone.adds_bos if cfg.head.skip_bos is None else bool(cfg.head.skip_bos)
    main_metric = args.metric or ("mcc" if data.name == "cola" else "accuracy")
    positive = data.labels.index(cfg.task.positive_label) if cfg.task.positive_label else None
    layers = list(range(backbone.num_layers))
    settings = {"config": args.config, "base": args.base, "overrides": args.overrides, "metric": main_metric,
                "skip_bos": skip_bos, "max_length": cfg.model.max_length, "C_grid": [0.001, 0.01, 0.1, 1.0],
                "rows": {n: len(s.rows) for n, s in encoded.items()}, "source": type(source).__name__,
                "device": f"cpu ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})"}
    print("settings:", json.dumps(settings), flush=True)
    t0 = time.perf_counter()
    pad = backbone.tokenizer.pad_token_id or 0
    feats = {n: features(source, encoded[n], layers, skip_bos, cfg.train.eval_batch_size, pad)
             for n in ("train", "validation", "test")}
    read_s = time.perf_counter() - t0
    result = {"settings": settings, "read_seconds": read_s, "mean": {}, "last": {}}
    (mtr, ltr, ytr), (mva, lva, yva), (mte, lte, yte) = (feats[n] for n in ("train", "validation", "test"))
    for i in layers:
        for kind, tr, va, te in (("mean", mtr, mva, mte), ("last", ltr, lva, lte)):
            r = fit_probe(tr[i], ytr, va[i], yva, te[i], yte, data.labels, main_metric, positive, cfg.train.seed)
            result[kind][i] = r
            log.info("layer %2d %-4s validation %.3f test %.3f (C=%g)", i, kind, r["validation"], r["test"], r["C"])
    cat = [np.concatenate([f[i] for i in layers], 1) for f in (mtr, mva, mte)]
    result["concat"] = fit_probe(cat[0], ytr, cat[1], yva, cat[2], yte, data.labels, main_metric, positive,
                                 cfg.train.seed)
    for kind in ("mean", "last"):
        best = max(layers, key=lambda i: result[kind][i]["validation"])
        result[f"best_{kind}"] = {"layer": best, **result[kind][best]}
    result["seconds"] = time.perf_counter() - t0
    out = HERE / "results" / f"probes_{data.name}_{args.base}{args.tag}.json"
    write_json(out, result)
    print(f"{data.name} on {args.base} ({main_metric}, test): best mean-pooled layer {result['best_mean']['layer']} "
          f"{result['best_mean']['test']:.3f}, best last-token layer {result['best_last']['layer']} "
          f"{result['best_last']['test']:.3f}, all layers concatenated {result['concat']['test']:.3f} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
