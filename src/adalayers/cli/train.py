"""`adalayers train`: train a side-task head on a frozen base into a run folder."""
from __future__ import annotations

from pathlib import Path

from adalayers.cli.common import add_config_args, dump
from adalayers.errors import AdaLayersError


def cmd_train(args) -> int:
    from adalayers.data.tasks.shortcut import load_config
    from adalayers.recipes import service

    cfg = load_config(args)
    if args.select_layers is not None:
        return _select(cfg, args)
    metrics = service.train(cfg, Path(args.out), resume=True if args.resume else None, overwrite=args.overwrite)
    from adalayers.engine import distributed

    if not distributed.is_main():  # under torchrun, rank 0 reports for all
        return 0
    shown = {split: metrics[split] for split in ("validation", "test") if split in metrics}
    print(dump({**shown, "kept": metrics.get("kept", "head"), "trainable_params": metrics["trainable_params"],
                "train_seconds": metrics["train_seconds"]}))
    if metrics.get("probe"):
        print((Path(args.out) / "selection.md").read_text(encoding="utf-8"))
    if "test" not in metrics:
        print("no test split: the numbers above are validation only")
    print(f"run folder: {args.out}")
    return 0


def _select(cfg, args) -> int:
    import sys

    from adalayers.recipes.select import select_layers

    if args.resume:
        raise AdaLayersError("--resume: with --select-layers, run the same command again (finished candidates "
                             "are reused)")
    out = Path(args.out)
    select_layers(cfg, out, args.select_layers, command="adalayers " + " ".join(sys.argv[1:]),
                  overwrite=args.overwrite)
    from adalayers.engine import distributed

    if distributed.is_main():
        print((out / "selection.md").read_text(encoding="utf-8"))
        print(f"run folder: {out} (the chosen candidate; every candidate is in {out / 'candidates'})")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("train", help="train a side-task head on a frozen base")
    add_config_args(p, optional=True)
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from its last completed epoch (automatic when --out "
                        "holds an unfinished run)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished run in --out; the old run stays intact until the new one has finished")
    p.add_argument("--select-layers", type=int, metavar="K",
                   help="train the mixer, then its K most favoured single layers and the middle layer alone "
                        "(from the same base pass or cache), and keep the best on validation as --out's run; "
                        "OUT/selection.md says which won and why")
    p.add_argument("--keep", choices=["head", "probe", "best"],
                   help="what the run folder keeps: the trained head, the best linear probe (fitted on every run), "
                        "or the better of the two on validation (default: best; train.keep); OUT/selection.md "
                        "says which and why")
    p.add_argument("--time-budget", type=float, metavar="MINUTES",
                   help="minutes for the whole run, the cache build included: the head's training time (and if "
                        "needed model.max_length) are chosen to fit, and said (train.time_budget)")
    from adalayers.data.tasks.shortcut import add_data_args

    add_data_args(p)  # --data FILE --text COLUMN --label COLUMN ...: your own data without a config
    p.set_defaults(fn=cmd_train, torchrun=True)
