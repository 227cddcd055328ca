"""`adalayers tune CONFIG --trials N --out DIR`: a hyper-parameter search from the hidden-state cache.

Optuna's TPE sampler proposes the settings of each trial from the space in adalayers.lab.tune.space;
a trial is one `service.train` into DIR/trials/trial_<n>/, scored on the validation split only.
After every epoch the trial reports its validation metric and the median pruner may stop it
(a trial is pruned when its best value so far is below the median of earlier trials at that epoch).

The study lives in DIR/study.db (SQLite): running the same command again continues it, counting
the trials that finished (complete or pruned) towards N; a trial that was interrupted is run again
with the same settings. `--workers W` runs W processes on the one study at once (on a GPU, or on a
CPU with a core per worker); each asks for its next trial under a file lock, so the study ends with N.
The base is loaded and the data encoded once per process; the base's hidden states come from the
on-disk cache, so a trial costs only the head's epochs.

At the end the best trial (highest validation metric) is copied to DIR/best/ and only it is scored
on the test split, once. Written: best_config.yaml (the config that reproduces the best trial),
trials.md / trials.json (every trial: state, value, epochs, time, settings), tune.json (a summary),
optimization_history.png and param_importances.png (Optuna's matplotlib plots).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shutil
import sys
import time
from pathlib import Path

import yaml

from adalayers import config as config_mod
from adalayers.store import run as runlib
from adalayers.errors import AdaLayersError, ConfigError
from adalayers.lab.tune import space as space_mod

log = logging.getLogger(__name__)
STUDY = "adalayers"
# settings that do not change what a trial learns: a study may be continued with other values
_FREE = {"train": {"device", "num_threads", "eval_batch_size"}, "cache": None}


def _identity(cfg) -> dict:
    d = cfg.to_dict()
    for section, keys in _FREE.items():
        if keys is None:
            d.pop(section, None)
        else:
            d[section] = {k: v for k, v in d[section].items() if k not in keys}
    return d


@contextlib.contextmanager
def _exclusive(out: Path):
    """One tuner per study folder: a second one would mistake the first one's running trial for a dead one."""
    with open(out / ".tune.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AdaLayersError(f"another 'adalayers tune' is running on {out}") from None
        yield


def _open_study(cfg, out: Path):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=STUDY, storage=f"sqlite:///{out / 'study.db'}", load_if_exists=True,
                                direction="maximize", sampler=_sampler(cfg), pruner=_pruner(cfg))
    identity = _identity(cfg)
    old = study.user_attrs.get("config")
    if old is None:
        study.set_user_attr("config", identity)
    else:  # compared as the study stored it (JSON), with the fields added since at their defaults
        diffs = config_mod.differences(old, json.loads(json.dumps(identity)), _FREE)
        if diffs:
            raise AdaLayersError(f"{out / 'study.db'} holds a study of another config ({'; '.join(diffs)}); "
                                 f"use another --out or delete that folder")
    return study


def _sampler(cfg, worker: int = 0):
    """TPE; each worker process draws from its own seed, or they would all propose the same start-up trials."""
    import optuna

    return optuna.samplers.TPESampler(seed=cfg.tune.seed + worker, n_startup_trials=cfg.tune.startup_trials)


def _pruner(cfg):
    import optuna

    return optuna.pruners.MedianPruner(n_startup_trials=cfg.tune.startup_trials,
                                       n_warmup_steps=cfg.tune.warmup_epochs)


def _recover(study) -> None:
    """Trials left running by a killed tuner failed; every interrupted trial is queued once more."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    for t in trials:
        if t.state == TrialState.FAIL and t.user_attrs.get("interrupted") and t.number not in retried:
            log.info("trial %d was interrupted: queued again with the same settings", t.number)
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)


def _read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def finished(study) -> list:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def tune(cfg, out: Path, trials: int, timeout: float | None = None, workers: int = 1) -> dict:
    """Run the search until the study holds `trials` finished trials (or `timeout` seconds pass).

    With `workers` > 1, that many processes share the study: this one and workers - 1 started beside it (each
    loads the base and runs trials one after the other); a lock around "count the trials, ask for the next"
    keeps the total at `trials` exactly.
    """
    from adalayers.recipes import service

    if trials < 1:
        raise ConfigError(f"--trials: must be at least 1, got {trials}")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"--timeout: must be a positive number of seconds, got {timeout}")
    if workers < 1:
        raise ConfigError(f"--workers: must be at least 1, got {workers}")
    space_mod.build(cfg)  # a bad space fails before anything is loaded
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    deadline = None if timeout is None else time.time() + timeout
    with _exclusive(out):
        prepared = service.prepare(cfg)  # sets head.kind from the data
        study = _open_study(cfg, out)
        _recover(study)
        remaining = trials - len(finished(study))
        if remaining > 0:
            log.info("%s: %d finished trials, running %d more in %d process(es)", out / "study.db",
                     trials - remaining, remaining, min(workers, remaining))
            first = len(study.get_trials(deepcopy=False))  # trials from here on are this call's
            procs = _start_workers(cfg, out, trials, first, deadline, min(workers, remaining) - 1)
            try:  # this process is worker 0, with the base it loaded already
                _search(study, cfg, out, trials, first, deadline, prepared)
            except BaseException:
                for p in procs:  # Ctrl-C reached them too; anything else stops them (their trials are retried)
                    if not isinstance(sys.exc_info()[1], KeyboardInterrupt):
                        p.terminate()
                    p.join()
                raise
            _join_workers(procs, out)
        summary = write_results(study, cfg, out, prepared, time.perf_counter() - t0)
    return summary


def _start_workers(cfg, out: Path, trials: int, first: int, deadline: float | None, count: int) -> list:
    """Start `count` more processes of `_worker` on the study (workers 1..count; this process is worker 0)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # a fork would copy a started CUDA context or thread pool
    level = logging.getLogger("adalayers").getEffectiveLevel()
    procs = [ctx.Process(target=_worker, args=(cfg, out, trials, first, deadline, i, level),
                         name=f"tune-worker-{i}") for i in range(1, count + 1)]
    for p in procs:
        p.start()
    return procs


def _join_workers(procs: list, out: Path) -> None:
    for p in procs:
        p.join()
    bad = [f"{p.name} exited with {p.exitcode}" for p in procs if p.exitcode]
    if bad:
        raise AdaLayersError(f"{'; '.join(bad)} (its log says why); the finished trials are kept in "
                             f"{out / 'study.db'}: run the command again to continue")


def _worker(cfg, out: Path, trials: int, first: int, deadline: float | None, index: int, level: int) -> None:
    """One search process: loads the base and the data itself and runs trials until the study is full."""
    import optuna

    from adalayers import progress
    from adalayers.recipes import service
    from adalayers.engine.progress import setup_logging

    setup_logging(level)  # as the CLI does: messages one line each, bars as lines in a log file
    progress.configure()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    prepared = service.prepare(cfg)
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{out / 'study.db'}",
                              sampler=_sampler(cfg, index), pruner=_pruner(cfg))
    _search(study, cfg, out, trials, first, deadline, prepared)


@contextlib.contextmanager
def _asking(out: Path):
    with open(out / ".ask.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


_TAKEN = ("COMPLETE", "PRUNED", "RUNNING")


def _search(study, cfg, out: Path, trials: int, first: int, deadline: float | None, prepared) -> None:
    """Ask for trials, train them and tell the study, until it holds `trials` trials that finished or
    are running (in any process), or the deadline has passed. A trial of this call (number >= `first`)
    that failed counts too, as an attempt: settings the model refuses end the call, not loop forever."""
    import gc

    import optuna
    from optuna.trial import TrialState

    from adalayers.recipes import service

    backbone, data, encoded = prepared
    unseen = (backbone, data, {k: v for k, v in encoded.items() if k != "test"})  # trials never see test
    epochs = cfg.tune.max_epochs or cfg.train.max_epochs
    params, fixed = space_mod.build(cfg)
    main = data.main_metric
    while deadline is None or time.time() < deadline:
        with _asking(out):
            taken = [t for t in study.get_trials(deepcopy=False) if t.state.name in _TAKEN or (
                t.state == TrialState.FAIL and t.number >= first and not t.user_attrs.get("interrupted"))]
            if len(taken) >= trials:
                return
            trial = study.ask()
        values = {**fixed, **{p.name: p.suggest(trial) for p in params}, "train.max_epochs": epochs}
        run_dir = out / "trials" / f"trial_{trial.number:03d}"
        shutil.rmtree(run_dir, ignore_errors=True)  # the study, not the folder, says what is done
        trial.set_user_attr("run", str(run_dir.relative_to(out)))
        log.info("trial %d: %s", trial.number, trial.params)

        def report(epoch: int, metric: float, trial=trial) -> None:
            trial.report(metric, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"validation {main} {metric:.4f} after epoch {epoch}")

        try:
            trial_cfg = space_mod.apply(cfg, values)
            trial_cfg.train.keep = "head"  # a trial scores the head its values trained (the probes are still reported)
            m = service.train(trial_cfg, run_dir, resume=False, prepared=unseen, on_epoch=report)
        except optuna.TrialPruned as e:
            log.info("trial %d pruned: %s", trial.number, e)
            study.tell(trial, state=TrialState.PRUNED)
        except ConfigError as e:  # settings the space allows but the model refuses: that trial fails
            log.warning("trial %d failed: %s", trial.number, e)
            study.tell(trial, state=TrialState.FAIL)
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                trial.set_user_attr("interrupted", True)  # run again with the same settings next time
            study.tell(trial, state=TrialState.FAIL)
            raise
        else:
            for key in ("epochs", "best_epoch", "train_seconds"):
                trial.set_user_attr(key, m[key])
            study.tell(trial, m["validation"][main])
        gc.collect()


def _best_trial(study):
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not done:
        raise AdaLayersError("no trial finished yet (every one was pruned, failed or interrupted): run tune again "
                             "to continue the study")
    return max(done, key=lambda t: (t.value, -t.number))


def score_best(study, cfg, out: Path, prepared) -> dict:
    """Copy the best trial's run folder to out/best and score it on the test split (once per best trial)."""
    from adalayers.recipes import service
    from adalayers.recipes.evaluate import evaluate_split
    from adalayers.model.precision import autocast_for

    best = _best_trial(study)
    best_dir, src = out / "best", out / best.user_attrs["run"]
    metrics = _read_json(best_dir / "metrics.json") if (best_dir / "metrics.json").is_file() else {}
    if metrics.get("trial") == best.number and ("test" in metrics or "test" not in prepared[2]):
        return metrics  # already scored: the test set is looked at once
    tmp = out / ".best.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    (tmp / "resume.pt").unlink(missing_ok=True)
    metrics = {**_read_json(tmp / "metrics.json"), "trial": best.number}
    backbone, data, encoded = prepared
    if "test" in encoded:
        task, run_cfg, _ = runlib.load_head(tmp, backbone)
        task.to(backbone.device)
        metrics["test"], _ = evaluate_split(task, service.make_source(run_cfg, backbone, data, encoded),
                                            encoded["test"], data.splits["test"], run_cfg.train.eval_batch_size,
                                            backbone.tokenizer.pad_token_id or 0,
                                            autocast_for(run_cfg.train.precision, backbone.device))
    runlib.write_json(tmp / "metrics.json", metrics)
    shutil.rmtree(best_dir, ignore_errors=True)
    tmp.rename(best_dir)
    return metrics


def best_config(study, out: Path):
    """The best trial's config, as the run folder saved it; written to out/best_config.yaml."""
    best = _best_trial(study)
    cfg = runlib.run_config(out / best.user_attrs["run"])
    text = (f"# adalayers tune: the best of {len(finished(study))} trials (trial {best.number}, validation "
            f"{best.value:.4f}).\n# Train it with: adalayers train {out / 'best_config.yaml'} --out RUN\n")
    runlib.atomic_write(out / "best_config.yaml", text + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return cfg


def trial_rows(study) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() \
            if t.datetime_complete and t.datetime_start else None
        rows.append({"number": t.number, "state": t.state.name.lower(), "value": t.value,
                     "epochs": len(t.intermediate_values), "best_epoch": t.user_attrs.get("best_epoch"),
                     "seconds": round(seconds, 1) if seconds is not None else None, "params": t.params,
                     "retry_of": t.user_attrs.get("retry_of"), "run": t.user_attrs.get("run")})
    return rows


def _table(rows: list[dict], main: str, best: int) -> str:
    names = sorted({k for r in rows for k in r["params"]})
    lines = [f"| trial | state | validation {main} | epochs | seconds | " + " | ".join(names) + " |",
             "|---" * (5 + len(names)) + "|"]
    for r in rows:
        cells = [f"**{r['number']}**" if r["number"] == best else str(r["number"]), r["state"],
                 "" if r["value"] is None else f"{r['value']:.4f}", str(r["epochs"]),
                 "" if r["seconds"] is None else f"{r['seconds']:.0f}"]
        cells += [_cell(r["params"].get(n)) for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def plots(study, out: Path) -> dict:
    """Optuna's optimisation history and parameter importances (fANOVA), as PNG files."""
    import warnings

    import optuna.visualization.matplotlib as ovm

    from adalayers.lab.figures import pyplot, save_figure

    pyplot()  # the Agg backend, before Optuna imports pyplot
    written = {}
    for name, draw in (("optimization_history", ovm.plot_optimization_history),
                       ("param_importances", ovm.plot_param_importances)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                ax = draw(study)
        except (ValueError, RuntimeError) as e:  # importances need two finished trials that differ
            log.warning("no %s plot: %s", name, e)
            continue
        ax = ax[0] if hasattr(ax, "__len__") else ax
        save_figure(ax.figure, out / f"{name}.png")
        written[name] = f"{name}.png"
    return written


def write_results(study, cfg, out: Path, prepared, seconds: float) -> dict:
    rows = trial_rows(study)
    main = prepared[1].main_metric
    best = _best_trial(study)
    best_config(study, out)
    best_metrics = score_best(study, cfg, out, prepared)
    runlib.write_json(out / "trials.json", rows)
    runlib.atomic_write(out / "trials.md", _table(rows, main, best.number))
    figures = plots(study, out) if len(finished(study)) > 1 else {}
    states = {}
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + 1
    summary = {"study": str(out / "study.db"), "metric": main, "trials": states,
               "trial_seconds": round(sum(r["seconds"] or 0 for r in rows), 1),
               "this_session_seconds": round(seconds, 1),
               "best": {"trial": best.number, "validation": best.value, "params": best.params,
                        "epochs": best.user_attrs.get("epochs"), "best_epoch": best.user_attrs.get("best_epoch")},
               "best_validation": best_metrics.get("validation"), "best_test": best_metrics.get("test"),
               "space": {k: v for k, v in space_mod.merged(cfg).items()},
               "tune": cfg.tune.to_dict(), "figures": figures}
    runlib.write_json(out / "tune.json", summary)
    return summary
