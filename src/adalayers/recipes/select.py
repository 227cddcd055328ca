"""`adalayers train CONFIG --out OUT --select-layers K`: the mixer, its K most favoured single layers and the
middle layer, each trained from the same prepared base and data, the best on validation kept as OUT's run.

1. The mixer (AdaLayers over every layer) trains into OUT/candidates/adalayers/.
2. Its candidates: the K layers with the largest peak weight in its epoch log (log.jsonl, every epoch up to
   its best), and the middle layer (L-1)//2 when it is not among them. The peak, not the final weight: the
   mix concentrates in its first epochs on the layers that help, and may then drift towards the layers that
   fit the training sentences (docs/results.md, "Where the mixer loses to a single layer"). The middle layer
   because on a decoder the mix can leave it from the first epochs and the cutoff then drops it, though it
   is the best single layer (Gemma 3 270M's layer 9 on the CoNLL-2003 and QQP subsets): the peaks alone
   would never try it.
3. Each candidate layer trains alone (mixer.pin_layer = i) into OUT/candidates/layer_<i>/.
4. The candidate with the highest validation main metric wins (a tie goes to the mixer, then to the lower
   layer); its run files are copied into OUT, which is then a run folder like any other (predict, serve,
   export). OUT/selection.json and OUT/selection.md list every candidate with its validation (and test)
   metric and training time, and say which won and why. Test never takes part in the choice.

A candidate folder that holds a finished run of the same settings is reused, so an interrupted selection
resumes where it stopped.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from adalayers import config as config_mod
from adalayers.engine import distributed
from adalayers.errors import ConfigError, RunError
from adalayers.files import atomic_write, write_json
from adalayers.model.mixer import middle_layer
from adalayers.store import run as runlib

log = logging.getLogger(__name__)

CANDIDATES = "candidates"
SELECTION = "selection.json"
# settings that do not change what a run learns: a finished candidate is reused even if they differ
_IGNORED = {"cache": None, "tune": None, "train": {"device", "num_threads", "eval_batch_size", "keep"}}


@dataclass
class Candidate:
    name: str                      # "adalayers" or "layer <i>"
    folder: str                    # relative to OUT
    pin_layer: int | None
    validation: float
    test: float | None
    train_seconds: float


def peak_weights(log_entries: list[dict], best_epoch: int | None) -> list[float]:
    """Each layer's largest weight over the epochs up to the best one (all epochs when it is unknown)."""
    rows = [e["layer_weights"] for e in log_entries
            if e.get("layer_weights") and (best_epoch is None or e["epoch"] <= best_epoch)]
    if not rows:
        raise RunError("the mixer's epoch log holds no layer weights; cannot rank its layers")
    return [max(col) for col in zip(*rows)]


def candidate_layers(peaks: list[float], k: int, middle: bool = True) -> list[int]:
    """The k layers of largest peak weight (ties: the lower layer) and, with `middle`, the middle layer when
    it is not among them; in layer order."""
    ranked = sorted(range(len(peaks)), key=lambda i: (-peaks[i], i))[:k]
    if middle:
        ranked.append(middle_layer(len(peaks)))
    return sorted(set(ranked))


def choose(candidates: list[Candidate]) -> Candidate:
    """Highest validation; a tie goes to the mixer (no choice made on the data), then to the lower layer."""
    return max(candidates, key=lambda c: (c.validation, c.pin_layer is None, -(c.pin_layer or 0)))


def _train_or_reuse(cfg, run_dir: Path, prepared) -> dict:
    from adalayers.recipes import service

    if (run_dir / "metrics.json").is_file():
        stored = runlib.read_config(run_dir)["config"]
        if not config_mod.differences(stored, cfg.to_dict(), _IGNORED):
            log.info("select-layers: %s holds a finished run of these settings; reusing it", run_dir)
            return json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    # a candidate is its head: the probes are still fitted and reported in its metrics.json, never kept
    return service.train(config_mod.from_dict(cfg.to_dict(), ["train.keep=head"]), run_dir, prepared=prepared,
                         overwrite=True)


def _candidate(name: str, out: Path, run_dir: Path, metrics: dict, main: str, pin: int | None) -> Candidate:
    test = metrics.get("test", {}).get(main)
    return Candidate(name, str(run_dir.relative_to(out)), pin, float(metrics["validation"][main]),
                     None if test is None else float(test), float(metrics.get("train_seconds", 0.0)))


def _copy_run(src: Path, out: Path) -> None:
    """The winner's run files into `out`, each by rename from a temporary copy, metrics.json last (a run is
    finished when it has one); `out`'s own older run files that the winner lacks are removed first. The
    winner's own selection files (its head against its probe) stay in its folder: `out`'s are the selection's."""
    names = sorted(p.name for p in src.iterdir() if p.is_file() and p.name not in (SELECTION, "selection.md"))
    (out / "metrics.json").unlink(missing_ok=True)
    for p in out.iterdir():
        if p.is_file() and p.name not in names and p.name not in (SELECTION, "selection.md"):
            p.unlink()
    for name in sorted(names, key=lambda n: n == "metrics.json"):
        tmp = out / f".{name}.tmp"
        shutil.copy2(src / name, tmp)
        os.replace(tmp, out / name)


def table(summary: dict) -> str:
    main, chosen = summary["metric"], summary["chosen"]
    lines = [f"Command: `{summary['command']}`", "",
             f"Candidates: the mixer, its {summary['k']} layers of largest peak weight "
             f"(peaks over its epochs up to its best: {', '.join(f'layer {i} {w:.3f}' for i, w in summary['peaks'])})"
             f" and the middle layer ({summary['middle']}).",
             "", f"| candidate | validation {main} | test {main} | training s |", "|---|---:|---:|---:|"]
    for c in summary["candidates"]:
        mark = " **(chosen)**" if c["name"] == chosen else ""
        test = "-" if c["test"] is None else f"{c['test']:.4f}"
        lines.append(f"| {c['name']}{mark} | {c['validation']:.4f} | {test} | {c['train_seconds']:.1f} |")
    lines += ["", summary["why"], ""]
    return "\n".join(lines)


def select_layers(cfg, out: Path, k: int, command: str = "", overwrite: bool = False) -> dict:
    """Train the candidates, copy the winner's run into `out`, write selection.json/.md; returns the summary."""
    from adalayers.recipes import service

    if k < 1:
        raise ConfigError(f"--select-layers: must be at least 1 (candidate single layers), got {k}")
    if cfg.mixer.pin_layer is not None:
        raise ConfigError("--select-layers: the config pins mixer.pin_layer; selection trains the mixer and "
                          "picks the layers itself (leave mixer.pin_layer unset)")
    out = Path(out)
    if (out / "metrics.json").is_file() and not (out / SELECTION).is_file() and not overwrite:
        raise RunError(f"{out} holds a finished run that no selection made; give --overwrite to replace it, or "
                       f"choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    prepared = service.prepare(cfg)
    main = prepared[1].main_metric
    cands = out / CANDIDATES
    mix_dir = cands / "adalayers"
    mix = _train_or_reuse(cfg, mix_dir, prepared)
    peaks = peak_weights(runlib.read_log(mix_dir), mix.get("best_epoch"))
    top = min(k, len(peaks))
    layers = candidate_layers(peaks, top)
    log.info("select-layers: layers %s (the mixer's %d largest peak weights and the middle layer %d); training "
             "each alone", layers, top, middle_layer(len(peaks)))
    found = [_candidate("adalayers", out, mix_dir, mix, main, None)]
    for i in layers:
        run_dir = cands / f"layer_{i}"
        cfg_i = config_mod.from_dict(cfg.to_dict(), [f"mixer.pin_layer={i}"])
        found.append(_candidate(f"layer {i}", out, run_dir, _train_or_reuse(cfg_i, run_dir, prepared), main, i))
    best = choose(found)
    runner_up = max((c for c in found if c is not best), key=lambda c: c.validation, default=None)
    why = (f"Chosen: {best.name}, the highest validation {main} ({best.validation:.4f}"
           + (f"; next {runner_up.name}, {runner_up.validation:.4f}" if runner_up else "") + ").")
    summary = {"command": command, "metric": main, "k": top, "middle": middle_layer(len(peaks)),
               "peaks": [(i, round(w, 6)) for i, w in sorted(enumerate(peaks), key=lambda p: -p[1])[:top]],
               "candidates": [asdict(c) for c in found], "chosen": best.name, "chosen_folder": best.folder,
               "why": why, "train_seconds_total": round(sum(c.train_seconds for c in found), 2)}
    if distributed.is_main():
        _copy_run(out / best.folder, out)
        write_json(out / SELECTION, summary)
        atomic_write(out / "selection.md", table(summary))
    distributed.barrier()
    log.info("select-layers: %s", why)
    return summary
