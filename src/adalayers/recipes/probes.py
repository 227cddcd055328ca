"""Linear probes in every run: the simplest thing that works on the same frozen states, fitted in seconds.

After the head has trained, the same states source (the cache, or the live base) is read once more:

    features   each layer's F_i = LayerNorm_noaffine(GELU(Z_i)) per token (what a probe head reads: the mixer
               pinned to layer i with an identity projection, adalayers.model.heads.probe_projection),
               pooled over the tokens the head sees: mean (every base), and the last token (decoders:
               only it has read the whole text). Token tasks: each labelled token's features.
    search     per layer and pooling, scikit-learn's LogisticRegression (classification; C in C_GRID) or
               Ridge (regression; alpha in ALPHA_GRID) on standardised features of at most SEARCH_ROWS
               training rows (drawn with train.seed), scored on at most SEARCH_ROWS validation rows with
               the task's main metric (token tasks: macro F1 over the tags, a stand-in for entity F1).
               Token tasks (a row per labelled token: tens of thousands, 57 fits took 305 s a seed on
               gemma3-270m) search in two stages: every layer at C = TOKEN_C on at most SEARCH_TOKENS of the
               search rows' tokens, then the best layer's C grid on all of them
    refit      the best (layer, pooling, C) fitted again on every training row, from a second read of that
               layer, when the search read a subsample (else the search's fit is the probe)
    head       the fit as a probe head (head.type probe): its standardisation folded into the linear map,
               so the saved head computes exactly what was fitted, and scored on validation and test by
               the same evaluation as any head (those are the numbers metrics.json reports)
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from adalayers import config as config_mod
from adalayers import metrics
from adalayers.data.encoding import EncodedSplit, split_batch
from adalayers.engine.loss import IGNORE
from adalayers.kinds import TaskKind
from adalayers.model.heads import pool
from adalayers.model.mixer import activate, mixed_up_to, normalize
from adalayers.model.sidetask import SideTask

log = logging.getLogger(__name__)

SEARCH_ROWS = 3_000         # training (and validation) rows the layer / pooling / C search reads
C_GRID = (0.01, 0.1, 1.0)   # LogisticRegression's inverse regularisation
ALPHA_GRID = (1.0, 10.0, 100.0, 1000.0)  # Ridge's regularisation
MAX_ITER = 500
SEARCH_TOKENS = 10_000      # token tasks: the labelled tokens the layers are compared on
TOKEN_C = 0.1               # token tasks: the C the layers are compared at


@dataclass
class ProbeFit:
    """The chosen probe: where it reads, its regularisation, the search's scores, and the fitted head."""
    layer: int
    pooling: str
    reg: float
    search_validation: float
    search: list[dict] = field(default_factory=list)  # every (layer, pooling, reg) tried, its validation score
    task: SideTask | None = None
    seconds: float = 0.0
    rows: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"layer": self.layer, "pooling": self.pooling, "regularisation": self.reg,
                "search_validation": round(self.search_validation, 6), "seconds": round(self.seconds, 2),
                "rows": self.rows, "search": self.search}


def poolings(kind: TaskKind, decoder: bool) -> tuple[str, ...]:
    if kind == TaskKind.TOKENS:
        return ("token",)
    return ("mean", "last") if decoder else ("mean",)


def probe_config(cfg, layer: int, pooling: str, hidden_size: int):
    """The run config of a probe head on `layer`: the mixer pinned there, identity projection (k = width), no
    positions, no dropout; head.type probe."""
    head = {**cfg.head.to_dict(), "type": "probe", "num_heads": 1, "dropout": 0.0, "attention_dropout": None,
            "pooling": "mean" if pooling == "token" else pooling}
    mixer = {**cfg.mixer.to_dict(), "pin_layer": layer, "k": hidden_size, "positional": False, "dropout": 0.0,
             "projection_dropout": False, "gelu_after_sum": False, "init_layer": None}
    return config_mod.from_dict({**cfg.to_dict(), "mixer": mixer, "head": head})


class PooledFeatures:
    """A 'task' a states source feeds (source.run(batch, [this])): per layer, each row's pooled probe features
    (or each labelled token's), as a probe head on that layer would see them."""

    packed_ok = False

    def __init__(self, layers: list[int], how: tuple[str, ...], seen):
        self.layers, self.how, self.seen = layers, how, seen
        self.mask: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None
        self.out: dict[tuple[int, str], list[np.ndarray]] = {(i, h): [] for i in layers for h in how}

    def used_layers(self) -> list[int]:
        return self.layers

    def begin(self) -> None:
        pass

    def tap(self, i: int, z: torch.Tensor) -> None:
        if i not in self.layers:
            return
        f = normalize(activate(z, torch.float32), z.shape[-1])[..., 0, :]  # identity W_i: the probe head's F_i
        seen = self.seen(self.mask.to(f.device))
        for how in self.how:
            x = f[self.labels != IGNORE] if how == "token" else pool(f.masked_fill(~seen.unsqueeze(-1), 0), seen, how)
            self.out[(i, how)].append(x.cpu().numpy())


def read_features(source, split: EncodedSplit, rows: list[int], layers: list[int], how: tuple[str, ...], seen,
                  batch_size: int, pad_id: int):
    """({(layer, pooling): (n, d) features}, labels) of `rows` of a split (rows sorted by length; features and
    labels in the same order). Token tasks: one row per labelled token."""
    col = PooledFeatures(layers, how, seen)
    order = sorted(rows, key=lambda r: len(split.rows[r]["input_ids"]))  # less padding
    ys = []
    with torch.no_grad():
        for s in range(0, len(order), batch_size):
            batch = split_batch(split, order[s:s + batch_size], pad_id)
            col.mask, col.labels = batch["attention_mask"].bool(), batch["labels"]
            source.run(batch, [col])
            y = batch["labels"]
            ys.append((y[y != IGNORE] if "token" in how else y).numpy())
    return {key: np.concatenate(v) for key, v in col.out.items()}, np.concatenate(ys)


def fit_linear(kind: TaskKind, x: np.ndarray, y: np.ndarray, reg: float, seed: int):
    """(scaler, model) fitted on x: StandardScaler, then LogisticRegression(C=reg) or Ridge(alpha=reg).

    On one BLAS thread: the products of a fit this small (at most SEARCH_ROWS rows) take microseconds, and
    OpenBLAS's threads, spinning beside torch's own OpenMP threads in the same process, made the same 3 fits
    (400 rows, 640 features, 5 classes) take 11.8 s instead of 0.35 s on a busy 2-core machine (sst5's 114
    fits: 298 s)."""
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        scaler = StandardScaler().fit(x)
        xs = scaler.transform(x)
        if kind == TaskKind.REGRESSION:
            return scaler, Ridge(alpha=reg).fit(xs, y)
        return scaler, LogisticRegression(C=reg, max_iter=MAX_ITER, random_state=seed).fit(xs, y)


def search_score(kind: TaskKind, main: str, y, pred, labels: list[str], positive) -> float:
    if kind == TaskKind.REGRESSION:
        return float(metrics.regression(list(map(float, y)), list(map(float, pred)))[main])
    if kind == TaskKind.TOKENS:
        from sklearn.metrics import f1_score

        return float(f1_score(y, pred, average="macro"))
    return float(metrics.classification(list(map(int, y)), list(map(int, pred)), labels, positive)[main])


def folded(kind: TaskKind, scaler, model, num_labels: int):
    """The fit as one linear map on the unstandardised features: (W, b) with W x + b = the model's logits on the
    standardised x (regression: its prediction, in the targets' standard units it was fitted on)."""
    scale = np.where(scaler.scale_ == 0, 1.0, scaler.scale_)
    coef, bias = np.atleast_2d(model.coef_), np.atleast_1d(model.intercept_)
    w, b = coef / scale, bias - (coef / scale) @ scaler.mean_
    if kind == TaskKind.REGRESSION:  # fitted on standardised targets: the head gives mean + std * (W x + b)
        return w, b
    W = np.zeros((num_labels, w.shape[1]))
    B = np.full(num_labels, -1e4)  # a label never seen in training is never predicted
    classes = [int(c) for c in model.classes_]
    if len(classes) == 2:  # binary: one row of logits for the second class, the first at 0
        W[classes[1]], B[classes[1]], B[classes[0]] = w[0], b[0], 0.0
    else:
        W[classes], B[classes] = w, b
    return W, B


def fit_probes(cfg, backbone, data, encoded: dict, source, pad_id: int) -> ProbeFit | None:
    """Search every layer (up to mixer.max_layer) and pooling, refit the best on all training rows, and build its
    probe head (on the base's device, eval mode). None (said) when the data gives nothing to fit."""
    t0 = time.perf_counter()
    kind = TaskKind.parse(data.kind)
    if "validation" not in encoded or not encoded["train"].rows:
        log.info("[%s] linear probes: no validation split to choose them on; skipped", data.name)
        return None
    layers = list(range(mixed_up_to(backbone.num_layers, cfg.mixer) + 1))
    how = poolings(kind, bool(getattr(backbone, "is_causal", False)))
    template = SideTask(probe_config(cfg, 0, how[0], backbone.hidden_size), backbone.num_layers,
                        backbone.hidden_size, data.labels, bos=backbone.adds_bos)
    rng = np.random.default_rng(cfg.train.seed)
    n_train, n_val = len(encoded["train"].rows), len(encoded["validation"].rows)
    train_rows = sorted(rng.choice(n_train, SEARCH_ROWS, replace=False)) if n_train > SEARCH_ROWS else list(range(n_train))
    val_rows = sorted(rng.choice(n_val, SEARCH_ROWS, replace=False)) if n_val > SEARCH_ROWS else list(range(n_val))
    bs = cfg.train.eval_batch_size
    xtr, ytr = read_features(source, encoded["train"], train_rows, layers, how, template.seen, bs, pad_id)
    xva, yva = read_features(source, encoded["validation"], val_rows, layers, how, template.seen, bs, pad_id)
    if kind != TaskKind.REGRESSION and len(np.unique(ytr)) < 2:
        log.info("[%s] linear probes: the training rows hold one label only; skipped", data.name)
        return None
    main = data.main_metric
    positive = _positive(cfg, data.labels)
    ytr_fit = _standard(ytr, cfg) if kind == TaskKind.REGRESSION else ytr
    grid = ALPHA_GRID if kind == TaskKind.REGRESSION else C_GRID
    tried: list[dict] = []
    fitted: dict[tuple, tuple] = {}  # (layer, pooling, reg) -> (scaler, model), fitted on every search row

    def score(i: int, h: str, reg: float, rows=None, stage: str | None = None) -> float:
        x, y = (xtr[(i, h)], ytr_fit) if rows is None else (xtr[(i, h)][rows], ytr_fit[rows])
        scaler, model = fit_linear(kind, x, y, reg, cfg.train.seed)
        if rows is None:
            fitted[(i, h, reg)] = (scaler, model)
        pred = model.predict(scaler.transform(xva[(i, h)]))
        val = search_score(kind, main, yva, _unstandard(pred, cfg) if kind == TaskKind.REGRESSION else pred,
                           data.labels, positive)
        tried.append({"layer": i, "pooling": h, "regularisation": reg, "validation": round(val, 6),
                      **({"stage": stage, "rows": len(y)} if stage else {})})
        return val

    if kind == TaskKind.TOKENS:  # layers at one C on a token subsample, then the best layer's C on every token
        sub = np.sort(rng.choice(len(ytr), SEARCH_TOKENS, replace=False)) if len(ytr) > SEARCH_TOKENS else None
        by_layer = {key: score(*key, TOKEN_C, sub, "layers") for key in xtr}
        i, h = max(by_layer, key=by_layer.get)  # the first of equal scores: the lowest layer
        best = max(((score(i, h, reg, None, "regularisation"), i, h, reg) for reg in grid), key=lambda b: b[0])
    else:
        best = max(((score(i, h, reg), i, h, reg) for (i, h) in xtr for reg in grid), key=lambda b: b[0])
    val, layer, how_best, reg = best
    if n_train > SEARCH_ROWS:  # refit on every training row: one more read, of the chosen layer only
        x_all, y_all = read_features(source, encoded["train"], list(range(n_train)), [layer], (how_best,),
                                        template.seen, bs, pad_id)
        y_fit = y_all
        scaler, model = fit_linear(kind, x_all[(layer, how_best)], _standard(y_fit, cfg)
                                   if kind == TaskKind.REGRESSION else y_fit, reg, cfg.train.seed)
    else:  # the search read every training row: its fit is the probe
        y_fit, (scaler, model) = ytr, fitted[(layer, how_best, reg)]
    task = probe_task(cfg, backbone, data.labels, layer, how_best, *folded(
        kind, scaler, model, max(len(data.labels), 1)))
    fit = ProbeFit(layer, how_best, reg, val, tried, task, time.perf_counter() - t0,
                   {"search_train": len(train_rows), "search_validation": len(val_rows), "fit": len(y_fit)})
    log.info("[%s] linear probes: %d fits (%s) on %s of %s training rows, scored on %s validation rows: "
             "best layer %d, %s pooling, %s %g (validation %s %.4f); the probe fitted on %s rows; %.1f s",
             data.name, len(tried), _plan(kind, len(layers), how, grid, len(ytr)), f"{len(train_rows):,}",
             f"{n_train:,}", f"{len(val_rows):,}", layer, how_best,
             "C" if kind != TaskKind.REGRESSION else "alpha", reg, main, val, f"{len(y_fit):,}", fit.seconds)
    return fit


def _plan(kind: TaskKind, layers: int, how: tuple[str, ...], grid: tuple, tokens: int) -> str:
    name = "alpha" if kind == TaskKind.REGRESSION else "C"
    if kind == TaskKind.TOKENS:
        return (f"{layers} layers at C {TOKEN_C:g} on {min(tokens, SEARCH_TOKENS):,} of {tokens:,} tokens, then the "
                f"best layer at C {list(grid)} on every token")
    return f"{layers} layers x {'/'.join(how)} x {name} {list(grid)}"


def probe_task(cfg, backbone, labels: list[str], layer: int, pooling: str, weight, bias) -> SideTask:
    """A probe head (SideTask, head.type probe) on `layer` with the linear map (weight, bias), eval mode."""
    task = SideTask(probe_config(cfg, layer, pooling, backbone.hidden_size), backbone.num_layers,
                    backbone.hidden_size, labels, bos=backbone.adds_bos)
    with torch.no_grad():
        task.head.out.weight.copy_(torch.as_tensor(weight, dtype=torch.float32).reshape(task.head.out.weight.shape))
        task.head.out.bias.copy_(torch.as_tensor(bias, dtype=torch.float32).reshape(task.head.out.bias.shape))
    task.to(backbone.device)
    task.eval()
    return task


def _positive(cfg, labels: list[str]):
    from adalayers.recipes.evaluate import positive_index

    return positive_index(cfg, labels)


def _standard(y: np.ndarray, cfg) -> np.ndarray:
    return (y - (cfg.head.target_mean or 0.0)) / (cfg.head.target_std or 1.0)


def _unstandard(y: np.ndarray, cfg) -> np.ndarray:
    return (cfg.head.target_mean or 0.0) + (cfg.head.target_std or 1.0) * y
