"""The application service: a config prepared, trained into a run folder, evaluated, predicted with, as plain
functions (the CLI parses a command line and calls them; the lab, benchmarks and Python users call them too)."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from adalayers import config as config_mod
from adalayers.store import checkpoint
from adalayers.recipes import health
from adalayers.store import run as runlib
from adalayers import textcheck
from adalayers.model.backbone import Backbone
from adalayers.data.encoding import choose_max_length, encode
from adalayers.errors import AdaLayersError, DataError, RunError
from adalayers.recipes.evaluate import evaluate_split
from adalayers.model.sidetask import SideTask
from adalayers.model.states import LiveStates
from adalayers.data.tasks import load_task
from adalayers.data.templates import Template
from adalayers.model.precision import autocast_for, precision_of, warn_if_slow
from adalayers.recipes.train import fit
from adalayers.recipes.keep import probe_and_keep
from adalayers.recipes import budget
from adalayers.core import pick_device, seed_everything
from adalayers.engine import distributed
from adalayers.kinds import TaskKind

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 100_000


def prepare(cfg, backbone: Backbone | None = None):
    """Config -> (backbone, task data, encoded splits)."""
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    device = pick_device(cfg.train.device)
    precision_of(cfg.train.precision, device)  # fp16 on a CPU fails here, before any loading
    warn_if_slow(cfg.train, device)
    distributed.start(device)  # under torchrun: join the process group
    backbone = backbone or load_base(cfg, device)
    data = load_task(cfg)
    resolve_head(cfg, data)
    template = Template.of(cfg)
    template.check(backbone.tokenizer, cfg.model.base, any(e.text_pair is not None for e in data.splits["train"]),
                   data.kind)
    if cfg.model.max_length is None:
        choose_max_length_from_data(cfg, backbone, data)
    return backbone, data, encode_splits(cfg, backbone, data)


def encode_splits(cfg, backbone, data) -> dict:
    """Every split of the task encoded at cfg.model.max_length."""
    template = Template.of(cfg)
    return {name: encode(ex, backbone.tokenizer, cfg.model.max_length, data.kind, data.labels, name, template)
            for name, ex in data.splits.items()}


def load_base(cfg, device: str | torch.device = "cpu"):
    """The frozen base of a run on the runtime its config names (model.runtime): a transformers Backbone, or
    llama.cpp running the GGUF file as it is (LlamaCppBackbone: the same forward with layer taps, on the CPU,
    cfg.train.num_threads threads). Its context holds 32 sequences: a larger batch runs in groups of 32 rows,
    faster and in less memory than one pass (its sequences share one KV cache: every token's attention and
    llama.cpp's buffers grow with the pass's tokens: benchmarks/llamacpp_groups.py)."""
    from adalayers import runtimes
    from adalayers.infer.loaders import LoadRequest

    request = LoadRequest(cfg.model.base, device=device, states=cfg.model.states, threads=cfg.train.num_threads,
                          n_seq=32)
    return runtimes.get(cfg.model.runtime, trains=True).load(request).runtime.base


def resolve_head(cfg, data) -> None:
    """Fill in what the head takes from the data: its kind and, for regression, the targets' scale."""
    if cfg.head.kind is None:
        cfg.head.kind = str(data.kind)  # the head follows the data unless the config names one
    elif data.kind != cfg.head.kind:
        raise AdaLayersError(f"task {data.name} is a {data.kind} task but head.kind is {cfg.head.kind!r}; "
                             f"set head.kind: {data.kind}")
    if cfg.head.kind == TaskKind.REGRESSION and cfg.head.target_mean is None:
        cfg.head.target_mean, cfg.head.target_std = target_scale([e.label for e in data.splits["train"]])


def target_scale(values) -> tuple[float, float]:
    """Mean and standard deviation of regression targets (std 1 when they are all equal)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.size == 0 or not np.isfinite(v).all():
        raise DataError("regression targets: the training split is empty or holds a value that is not a number")
    return float(v.mean()), float(v.std()) or 1.0


def base_token_limit(backbone: Backbone) -> int:
    """The most tokens the base takes in one row (its position embeddings; the tokenizer's limit)."""
    limits = [getattr(backbone.tokenizer, "model_max_length", None),
              getattr(getattr(backbone.model, "config", None), "max_position_embeddings", None)]
    limits = [int(x) for x in limits if isinstance(x, (int, float)) and 8 <= x < 1_000_000]
    return min(limits) if limits else 512


def choose_max_length_from_data(cfg, backbone: Backbone, data) -> None:
    """model.max_length not set: the length that holds 99% of the training examples, capped by the base."""
    choice = choose_max_length(data.splits["train"], backbone.tokenizer, data.kind, base_token_limit(backbone),
                               template=Template.of(cfg))
    cfg.model.max_length = choice.max_length
    what = "split into windows" if data.kind == TaskKind.TOKENS else "truncated"
    log.info("[%s] model.max_length not set: %d tokens, chosen from the data (holds 99%% of the %s training "
             "examples whole, at most the base's %d; the longest has %d); %.1f%% of them are %s. Change it with "
             "--set model.max_length=N", data.name, choice.max_length, f"{choice.examples:,}",
             base_token_limit(backbone), choice.longest, 100 * choice.share_over, what)


def make_source(cfg, backbone, data, encoded):
    """Hidden states for training: from the on-disk cache when it is enabled and fits, else live."""
    if cfg.cache.enabled:
        try:
            from adalayers.store.cache import cached_source
        except ImportError:
            return LiveStates(backbone)
        return cached_source(cfg, backbone, data, encoded) or LiveStates(backbone)
    return LiveStates(backbone)


def train(cfg, out: Path, resume: bool | None = None, prepared: tuple | None = None,
          backbone: Backbone | None = None, on_epoch=None, build_task=None, overwrite: bool = False) -> dict:
    """Train a head into run folder `out`.

    resume=None resumes automatically when `out` holds an unfinished run; True insists on resuming.
    A finished run in `out` (metrics.json) is refused unless overwrite=True; then the new run is built
    in a temporary folder beside it and swapped in only once it has finished (replace_run).
    prepared = prepare(cfg)'s result, to share a base and encoded data between runs that differ
    only in the mixer or head (e.g. the single-layer sweep);
    `backbone` shares one loaded base across runs (e.g. `compare`);
    `on_epoch(epoch, validation_metric)` is called after every epoch (see train.fit). Every split in
    the encoded data is scored at the end: leave "test" out of `prepared` to keep it unseen.
    `build_task(cfg, backbone, data)` builds a SideTask subclass instead of a plain SideTask.
    """
    out = Path(out)
    distributed.start(pick_device(cfg.train.device))  # under torchrun: rank 0 decides about `out` for all
    created = distributed.is_main() and not out.exists()
    try:
        return _train(cfg, out, resume, prepared, backbone, on_epoch, build_task, overwrite)
    except BaseException:
        if created:  # a run that failed before writing anything leaves no empty folder behind
            runlib.remove_if_empty(out)
        raise


def _train(cfg, out: Path, resume, prepared, backbone, on_epoch, build_task, overwrite: bool) -> dict:
    started = time.perf_counter()
    if distributed.is_main():
        runlib.clean_leftovers(out)  # a killed --overwrite's folders beside `out`
        out.mkdir(parents=True, exist_ok=True)
    finished, unfinished = distributed.broadcast(
        ((out / "metrics.json").is_file(), (out / checkpoint.NAME).is_file() and not (out / "metrics.json").is_file())
        if distributed.is_main() else None)
    if resume and not unfinished:
        raise AdaLayersError(f"--resume: {out} holds no unfinished run")
    if finished:
        if not overwrite:
            raise RunError(f"{out} holds a finished run (metrics.json); give --overwrite to replace it (it stays "
                           f"intact until the new run has finished), or choose another --out")
        return runlib.replace_run(out, lambda build: train(cfg, build, False, prepared, backbone, on_epoch, build_task))
    resume = unfinished if resume is None else resume
    if not resume and distributed.is_main():
        for name in ("metrics.json", checkpoint.NAME):
            (out / name).unlink(missing_ok=True)
    distributed.barrier()  # `out` is ready before any rank reads it
    seed_everything(cfg.train.seed)
    backbone, data, encoded = prepared or prepare(cfg, backbone)
    resolve_head(cfg, data)  # a shared `prepared` was resolved on another config
    seed_everything(cfg.train.seed)
    build = build_task or (lambda c, b, d: SideTask(c, b.num_layers, b.hidden_size, d.labels, bos=b.adds_bos))
    task = build(cfg, backbone, data)
    source = make_source(cfg, backbone, data, encoded)
    pad_id = backbone.tokenizer.pad_token_id or 0
    if cfg.train.time_budget and prepared is None:  # max_length (if needed) and train.max_minutes to fit
        fitted = budget.apply_budget(cfg, backbone, data, encoded, started, lambda c: encode_splits(c, backbone, data),
                                     budget.missing_entries(source, encoded))
        if fitted is not encoded:  # max_length lowered: new cache entries
            encoded, source = fitted, make_source(cfg, backbone, data, fitted)
    if hasattr(source, "entry_if_built"):  # the cache is built before the first epoch (its time said first)
        budget.build_cache(source, encoded, backbone, pad_id, cfg.train.seed)
    # what the data is (messages: logging shows them on rank 0 only)
    for note in data.notes:
        log.info("[%s] %s", data.name, note)
    for name, split in encoded.items():
        if split.num_truncated:
            log.info("[%s] %s: %d of %d texts reach max_length=%s and are truncated", data.name, name,
                     split.num_truncated, split.num_examples, cfg.model.max_length)
    summary = fit(task, source, data, encoded, cfg, out, backbone, pad_id, resume=resume, on_epoch=on_epoch)
    task, _, _ = runlib.load_head(out, backbone, build_task and build(cfg, backbone, data))
    task.to(backbone.device)
    autocast = autocast_for(cfg.train.precision, backbone.device)
    results, preds = {}, {}
    for split in ("validation", "test"):
        if split in encoded:
            results[split], preds[split] = evaluate_split(task, source, encoded[split], data.splits[split],
                                                          cfg.train.eval_batch_size, pad_id, autocast)
    metrics = {**results, "trainable_params": task.num_trainable(), "base_params": backbone.num_parameters(),
               "train_seconds": summary["train_seconds"], "best_epoch": summary["best_epoch"],
               "epochs": summary["epochs"], "layer_weights": task.mixer.layer_weights().tolist(),
               "truncated": {k: v.num_truncated for k, v in encoded.items()}, "notes": data.notes}
    if "validation" in results:  # the linear probes, and the better model kept (train.keep)
        metrics.update(probe_and_keep(cfg, out, backbone, data, encoded, source, pad_id, task, results, preds,
                                      autocast, distributed.is_main()))
        log.info("[%s] kept: the %s (%s)", data.name, metrics["kept"], metrics.get("kept_why", "no probe"))
    if distributed.is_main():  # rank 0 alone writes the run folder
        runlib.write_json(out / "metrics.json", metrics)
        (out / checkpoint.NAME).unlink(missing_ok=True)  # finished: nothing left to resume
        for warning in health.head_warnings(task.kind, task.labels, preds.get("validation", []), cfg.train,
                                            summary["epochs"]):
            log.warning("[%s] %s", data.name, warning)
    distributed.barrier()
    return metrics


def warn_if_unfinished(run_dir: Path) -> None:
    note = checkpoint.unfinished_note(run_dir)
    if note:
        log.warning("%s", note)


def evaluate(run_dir: Path, split: str = "test", runtime: str | None = None) -> dict:
    """The run's head scored on a split of its task, the base on `runtime` (torch or llama.cpp; None: the runtime
    the run was trained on, model.runtime) -> its metrics, also written to RUN/eval_<split>.json."""
    cfg = runlib.run_config(run_dir)  # the weights are read once, onto the base
    if runtime is not None and runtime != cfg.model.runtime:
        # llama.cpp's base runs in fp32 on the CPU, whatever the head was trained with
        cpu = ["train.device=auto", "train.precision=auto"] if runtime == "llama.cpp" else []
        cfg = config_mod.from_dict(cfg.to_dict(), [f"model.runtime={runtime}", *cpu])
    warn_if_unfinished(run_dir)
    backbone, data, encoded = prepare(cfg)
    task, _, _ = runlib.load_head(run_dir, backbone)
    task.to(backbone.device)
    if split not in encoded:
        raise DataError(f"task {data.name} has no {split} split")
    t0 = time.perf_counter()
    result, _ = evaluate_split(task, make_source(cfg, backbone, data, encoded), encoded[split], data.splits[split],
                               cfg.train.eval_batch_size, backbone.tokenizer.pad_token_id or 0,
                               autocast_for(cfg.train.precision, backbone.device))
    result["seconds"] = round(time.perf_counter() - t0, 2)
    result["runtime"] = cfg.model.runtime
    path = Path(run_dir) / f"eval_{split}.json"
    try:
        runlib.write_json(path, result)
    except OSError as e:  # e.g. a read-only run folder: the numbers are still given, nothing half-written
        raise ResultNotSaved(f"{path}: could not be written ({e.strerror or e}); the metrics above were not saved",
                             result) from None
    return result


class ResultNotSaved(RunError):
    """The result was computed but its file could not be written; `result` holds it."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result


def check_texts(texts: list[str], what: str = "text") -> None:
    textcheck.check_texts(texts, MAX_TEXT_CHARS, what)


def predict(run_dir: Path, texts: list[str], backbone: Backbone | None = None,
            text_pairs: list[str] | None = None, runtime: str = "torch") -> list[dict]:
    """The run's head on raw texts, through the one inference front door (SideTasks, as the service and
    predict-files answer): per text {"text", "text_pair" (pairs), "truncated", **the head's answer}, the
    answer as adalayers.infer.outputs writes it ({label, probabilities}, {value}, or {words, tags, scores,
    entities}). A head trained on sentence pairs needs `text_pairs` (one second text per text); any other
    head refuses them. runtime="llama.cpp": the run's GGUF base run quantized by llama.cpp."""
    from adalayers.data.tasks import check_pairs, takes_pairs
    from adalayers.infer.sidetasks import SideTasks

    check_texts(texts)
    cfg = runlib.run_config(run_dir)  # the weights are read once, onto the base
    warn_if_unfinished(run_dir)
    check_pairs(str(run_dir), takes_pairs(cfg), text_pairs, len(texts))
    if text_pairs is not None:
        check_texts(text_pairs, "second text")
    if runtime != "torch":
        side = SideTasks.load(cfg.model.base, [f"run={run_dir}"], runtime=runtime)
    else:
        backbone = backbone or Backbone.load(cfg.model.base, cfg.model.states, pick_device(cfg.train.device))
        side = SideTasks.from_backbone(backbone, [f"run={run_dir}"])
    results = side.predict(texts, ["run"], text_pairs)
    return [{**{k: v for k, v in r.items() if k not in ("base", "tasks")}, **r["tasks"]["run"]} for r in results]
