"""`adalayers tune CONFIG --trials N [--timeout S] [--workers W] --out DIR`: registers the sub-command."""
from __future__ import annotations

import json
from pathlib import Path


def add_commands(sub) -> None:
    p = sub.add_parser("tune", help="search the head's settings with Optuna (TPE, median pruning), training from "
                                    "the hidden-state cache; the best trial alone is scored on test")
    p.add_argument("config", help="YAML config file (see configs/); its tune: section sets the search space")
    p.add_argument("--trials", type=int, required=True,
                   help="finished trials the study should hold (trials already in DIR/study.db count)")
    p.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    p.add_argument("--workers", type=int, default=1,
                   help="processes that run trials at once on the one study (each loads the base; default 1)")
    p.add_argument("--out", required=True, help="study folder: study.db, trials/, best/, best_config.yaml, "
                                                "trials.md, tune.json, plots")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one config field (repeatable), e.g. --set tune.max_epochs=10")
    p.set_defaults(fn=_cmd_tune)


def _cmd_tune(args) -> int:
    from adalayers import config
    from adalayers.lab.tune.search import tune

    cfg = config.load(args.config, args.overrides)
    out = Path(args.out)
    summary = tune(cfg, out, args.trials, args.timeout, args.workers)
    print((out / "trials.md").read_text(encoding="utf-8"))
    print(json.dumps({k: summary[k] for k in ("trials", "trial_seconds", "best", "best_validation", "best_test")},
                     indent=2))
    print(f"best config: {out / 'best_config.yaml'}  best run: {out / 'best'}")
    return 0
