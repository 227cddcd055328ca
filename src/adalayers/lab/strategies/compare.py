"""`adalayers compare`: train several strategies on the same splits and seed, and measure each.

Each strategy runs in a fresh process (multiprocessing spawn) that loads the base and the data
itself, so its peak memory is its own: the peak resident set (VmHWM) of that process, and on a GPU
torch.cuda.max_memory_allocated. Inference is timed on up to `inference_rows` test rows after one
warm-up batch: for 1 task, and for 4 tasks - one base pass feeding 4 copies of the side task where
the strategy can share the base pass, 4 full passes where it cannot (measured, not multiplied).
The base's weights are hashed before and after: `base_bit_identical`.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from adalayers.store import run as runlib
from adalayers.data.encoding import EncodedSplit, batches
from adalayers.errors import AdaLayersError, ConfigError
from adalayers.core import weights_digest as digest

log = logging.getLogger(__name__)

DEFAULT = "adalayers,last-layer,scalar-mix,concat,finetune,finetune-top:3,adapters,adapters-shared3"
TASK_COUNTS = (1, 4)


def slug(spec: str) -> str:
    return spec.replace(":", "-")


# --- memory ------------------------------------------------------------------------------------

def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_mb() -> float | None:
    kb = _status_kb("VmRSS")
    return None if kb is None else round(kb / 1024, 1)


def reset_peak() -> None:
    """Linux: writing 5 to clear_refs resets the process's peak RSS to its current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_mb() -> float:
    kb = _status_kb("VmHWM")
    if kb is None:
        import resource
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kb / 1024, 1)


# --- timing ------------------------------------------------------------------------------------

def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_inference(infer, split: EncodedSplit, rows: int, batch_size: int, pad_id: int, device,
                   counts=TASK_COUNTS) -> dict:
    """Seconds per 1,000 rows for each task count (after one warm-up batch)."""
    part = EncodedSplit(split.name, split.rows[:rows], min(rows, split.num_examples))
    infer(next(batches(part, batch_size, pad_id)), max(counts))
    out = {}
    for n in counts:
        _sync(device)
        t0 = time.perf_counter()
        for batch in batches(part, batch_size, pad_id):
            infer(batch, n)
        _sync(device)
        out[str(n)] = round((time.perf_counter() - t0) / len(part.rows) * 1000, 3)
    return out


# --- one strategy ------------------------------------------------------------------------------

def run_one(cfg, spec: str, overrides: list[str], out: Path, inference_rows: int, backbone=None,
            ablate: bool = False, isolated: bool = False) -> dict:
    """Train and measure one strategy; writes out/result.json and returns it."""
    from adalayers.recipes import service
    from adalayers.lab import strategies
    from adalayers.core import seed_everything

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    strategy = strategies.make(spec, overrides)
    seed_everything(cfg.train.seed)
    backbone, data, encoded = service.prepare(cfg, backbone)
    before = digest(backbone.model)
    loaded_mb = rss_mb()
    reset_peak()
    seed_everything(cfg.train.seed)
    with torch.enable_grad():
        trained = strategy.train(cfg, backbone, data, encoded, out)
    peak = peak_mb()
    gpu_peak = round(torch.cuda.max_memory_allocated() / 2**20, 1) if backbone.device.type == "cuda" else None
    split = encoded.get("test") or encoded["validation"]
    pad_id = backbone.tokenizer.pad_token_id or 0
    with torch.no_grad():
        infer = time_inference(trained.infer, split, inference_rows, cfg.train.eval_batch_size, pad_id,
                               backbone.device)
        base_pass = time_inference(lambda b, n: backbone(b), split, inference_rows, cfg.train.eval_batch_size,
                                   pad_id, backbone.device, counts=(1,))["1"]
    identical = digest(backbone.model) == before
    base_params = backbone.num_parameters()
    result = {
        **strategy.describe(),
        "main_metric": data.main_metric,
        "validation": trained.results.get("validation"), "test": trained.results.get("test"),
        "trainable_params": trained.trainable_params, "base_params": base_params,
        "trainable_pct_of_base": round(100 * trained.trainable_params / base_params, 4),
        "train_seconds": trained.train_seconds, "epochs": trained.epochs, "best_epoch": trained.best_epoch,
        "inference_s_per_1000": infer, "inference_rows": min(inference_rows, len(split.rows)),
        "inference_split": split.name, "base_pass_s_per_1000": base_pass,
        "peak_rss_mb": peak, "loaded_rss_mb": loaded_mb,
        "peak_above_loaded_mb": round(peak - loaded_mb, 1) if loaded_mb is not None else None,
        "peak_gpu_mb": gpu_peak,
        "memory_method": ("VmHWM of a fresh process that loaded only this strategy" if isolated else
                          "VmHWM reset before training, in a shared process (a lower bound)"),
        "base_bit_identical": identical,
        "main_model": _main_model(strategy, identical),
        "extra": trained.extra,
        "run_config": cfg.to_dict(), "inference_rows_asked": inference_rows,
    }
    runlib.write_json(out / "result.json", result)
    if ablate and type(strategy).__name__.startswith("Adapters"):
        from adalayers.lab.strategies.ablation import ablate as run_ablation
        result["ablation"] = str(run_ablation(out, backbone=backbone)["png"])
        runlib.write_json(out / "result.json", result)
    return result


def _main_model(strategy, identical: bool) -> str:
    if not identical:
        return "CHANGED (bug)"
    if strategy.trains_base:
        return "copy trained (own full pass)"
    if not strategy.shares_base_pass:
        return "weights untouched, own full pass"
    return "untouched, shared pass"


def _child(cfg_dict, spec, overrides, out, inference_rows, ablate, num_threads) -> None:
    from adalayers import config as config_mod, progress

    progress.configure(verbose=False)  # a spawned process: the parent's progress settings are not inherited
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        run_one(config_mod.from_dict(cfg_dict), spec, overrides, Path(out), inference_rows, ablate=ablate,
                isolated=True)
    except BaseException as e:  # the parent reads this and reports it as one line
        runlib.write_json(Path(out) / "error.json", {"error": f"{type(e).__name__}: {e}",
                                                     "project_error": isinstance(e, AdaLayersError),
                                                     "traceback": traceback.format_exc()})
        raise SystemExit(1)


# --- all of them -------------------------------------------------------------------------------

def merge_seeds(runs: list[dict], seeds: list[int]) -> dict:
    """One strategy's results over several seeds: medians where one run has its numbers, and the spread."""
    from adalayers.lab.seeds import aggregate

    agg = aggregate([{k: r[k] for k in ("validation", "test", "train_seconds", "epochs", "best_epoch")
                      if r.get(k) is not None} for r in runs], seeds)
    merged = {**runs[0], **{k: agg[k] for k in ("validation", "test", "train_seconds", "epochs", "best_epoch")
                            if k in agg}}
    merged["inference_s_per_1000"] = {n: statistics.median(r["inference_s_per_1000"][n] for r in runs)
                                      for n in runs[0]["inference_s_per_1000"]}
    merged["base_bit_identical"] = all(r["base_bit_identical"] for r in runs)
    merged.update(seeds=seeds, spread=agg["spread"], train_seconds_total=agg["train_seconds_total"])
    return merged


def parse_strategy_sets(items: list[str], specs: list[str]) -> dict[str, list[str]]:
    """['finetune.lr=5e-5', 'finetune-top:3.top=2'] -> {spec: ['lr=5e-5', ...]}; names match specs or names."""
    by_spec: dict[str, list[str]] = {s: [] for s in specs}
    for item in items:
        key, eq, value = item.partition("=")
        target, dot, fld = key.rpartition(".")
        if not eq or not dot:
            raise ConfigError(f"--strategy-set {item!r}: expected STRATEGY.FIELD=VALUE, e.g. finetune.lr=5e-5")
        hits = [s for s in specs if target in (s, s.partition(":")[0])]
        if not hits:
            raise ConfigError(f"--strategy-set {item!r}: {target!r} is not among the strategies {specs}")
        for s in hits:
            by_spec[s].append(f"{fld}={value}")
    return by_spec


def _reusable(folder: Path, cfg, strategy, inference_rows: int) -> dict | None:
    """A finished result.json from the very same settings (run config, strategy config, rows)."""
    try:
        r = json.loads((folder / "result.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    same = (r.get("run_config") == json.loads(json.dumps(cfg.to_dict())) and r.get("inference_rows_asked") == inference_rows
            and r.get("config") == json.loads(json.dumps(strategy.describe()["config"])))
    return r if same else None


def compare(cfg, specs: list[str], out: Path, strategy_sets: list[str] | None = None, inference_rows: int = 1000,
            isolate: bool = True, ablate: bool = False, backbone=None, resume: bool = False, seeds: int = 1) -> dict:
    from adalayers.lab import strategies

    out = Path(out)
    if cfg.model.runtime != "torch":
        raise ConfigError(f"model.runtime={cfg.model.runtime}: compare's strategies (fine-tuning, adapters, full "
                          f"passes) need the base as a torch module; use model.runtime: torch")
    if not specs:
        raise ConfigError("--strategies: give at least one strategy")
    if seeds < 1:
        raise ConfigError(f"--seeds: must be at least 1, got {seeds}")
    if len(set(specs)) != len(specs):
        raise ConfigError(f"--strategies: a strategy is listed twice: {specs}")
    sets = parse_strategy_sets(strategy_sets or [], specs)
    made = {s: strategies.make(s, sets[s]) for s in specs}  # every setting checked before training starts
    out.mkdir(parents=True, exist_ok=True)
    if not isolate and backbone is None:
        from adalayers.model.backbone import Backbone
        from adalayers.core import pick_device
        backbone = Backbone.load(cfg.model.base, cfg.model.states, pick_device(cfg.train.device))
    from adalayers.lab.seeds import seed_config

    def one(s: str, cfg, folder: Path) -> dict:
        old = _reusable(folder, cfg, made[s], inference_rows) if resume else None
        if old is not None:
            log.info("== %s: reusing %s (same settings)", s, folder / "result.json")
            return old
        log.info("== %s -> %s", s, folder)
        (folder / "error.json").unlink(missing_ok=True)
        if isolate:
            ctx = mp.get_context("spawn")
            p = ctx.Process(target=_child, args=(cfg.to_dict(), s, sets[s], str(folder), inference_rows, ablate,
                                                 torch.get_num_threads()))
            p.start()
            p.join()
            if p.exitcode != 0:
                err = folder / "error.json"
                msg = json.loads(err.read_text())["error"] if err.is_file() else f"exit code {p.exitcode}"
                raise AdaLayersError(f"strategy {s} failed: {msg} (details in {err})")
            return json.loads((folder / "result.json").read_text())
        return run_one(cfg, s, sets[s], folder, inference_rows, backbone=backbone, ablate=ablate)

    results = []
    for s in specs:
        if seeds == 1:
            results.append(one(s, cfg, out / slug(s)))
        else:  # folder/seed_<n>/ per seed; the row holds the medians, and the spread
            runs = [one(s, seed_config(cfg, n), out / slug(s) / f"seed_{n}")
                    for n in range(cfg.train.seed, cfg.train.seed + seeds)]
            results.append(merge_seeds(runs, list(range(cfg.train.seed, cfg.train.seed + seeds))))
    summary = {"command": "adalayers " + " ".join(sys.argv[1:]), "config": cfg.to_dict(), "strategies": results,
               "device": "cuda" if torch.cuda.is_available() and cfg.train.device != "cpu" else "cpu",
               "torch_threads": torch.get_num_threads(),
               "notes": [
                   "Same splits, seed, epochs and batch size for every strategy; each strategy's own learning rate.",
                   "Inference: seconds per 1,000 test rows; '4 tasks' = one base pass feeding 4 copies of the side "
                   "task where the strategy shares the base pass, 4 full passes where it cannot (measured).",
                   "Shared-pass strategies stop the base at the deepest layer they read.",
                   "Peak memory: " + results[0]["memory_method"] + "; the base and data alone take loaded_rss_mb.",
                   "base_bit_identical: sha256 of every base tensor before training = after inference.",
               ]}
    from adalayers.lab.strategies.compare_report import write_report
    write_report(out, summary)
    return summary


def add_commands(sub) -> None:
    p = sub.add_parser("compare", help="train several strategies (adalayers, fine-tuning, adapters, ...) on the "
                                       "same data and compare quality, parameters and cost")
    p.add_argument("config", nargs="?", help="YAML config file (see configs/); optional with --data")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one config field for every strategy, e.g. --set task.max_train_examples=1000")
    from adalayers.data.tasks.shortcut import add_data_args

    add_data_args(p)  # --data FILE --text COLUMN --label COLUMN ...: your own data, as with train
    p.add_argument("--strategies", default=DEFAULT, help=f"comma-separated strategies (default: {DEFAULT})")
    p.add_argument("--strategy-set", dest="strategy_sets", action="append", default=[],
                   metavar="STRATEGY.FIELD=VALUE", help="override one strategy setting, e.g. finetune.lr=5e-5")
    p.add_argument("--out", required=True, help="folder for compare.json, compare.md, compare.png and one "
                                                "sub-folder per strategy")
    p.add_argument("--inference-rows", type=int, default=1000, help="test rows used to time inference")
    p.add_argument("--no-isolate", action="store_true", help="run every strategy in this process (faster "
                                                             "start; peak memory is then only a lower bound)")
    p.add_argument("--ablate", action="store_true", help="after training adapters, run the span ablation")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="train every strategy with N seeds (train.seed, +1, ...); the table shows medians and min-max")
    p.add_argument("--resume", action="store_true", help="reuse a strategy's result.json in --out when it was "
                                                         "made with exactly the same settings")
    p.set_defaults(fn=_cmd_compare)


def _cmd_compare(args) -> int:
    from adalayers.data.tasks.shortcut import load_config

    cfg = load_config(args)
    if args.inference_rows < 1:
        raise ConfigError("--inference-rows: must be at least 1")
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    specs = [s.strip() for s in args.strategies.split(",") if s.strip()]
    summary = compare(cfg, specs, Path(args.out), args.strategy_sets, args.inference_rows,
                      isolate=not args.no_isolate, ablate=args.ablate, resume=args.resume, seeds=args.seeds)
    print((Path(args.out) / "compare.md").read_text())
    return 0 if summary["strategies"] else 1
