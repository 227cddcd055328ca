"""adalayers: train small side-task heads on the hidden states of a frozen transformer, and serve them all from one forward pass.

Each command is a function here, or in a module listed in COMMAND_MODULES (one line per module).
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from adalayers.errors import AdaLayersError

# Modules that bring more sub-commands; each defines add_commands(subparsers). One line per module.
COMMAND_MODULES: list[str] = [
    "adalayers.cli.cache",
    "adalayers.cli.serve",
    "adalayers.cli.predict_files",
    "adalayers.lab.report",
    "adalayers.lab.sweep",
    "adalayers.lab.strategies.compare",
    "adalayers.lab.strategies.ablation",
    "adalayers.lab.multitask.compare",
    "adalayers.lab.tune.cli",
    "adalayers.data.tasks.fetch",
    "adalayers.cli.export",
    "adalayers.store.hub",
]


def _add_config_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("config", nargs="?" if optional else None,
                   help="YAML config file (see configs/)" + ("; optional with --data" if optional else ""))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one config field, e.g. --set train.lr=3e-4 (repeatable)")


def cmd_train(args) -> int:
    from adalayers import config
    from adalayers.cli import recipes

    if args.ensemble and (args.seeds or 1) < 2:
        raise AdaLayersError("--ensemble: needs --seeds N with N >= 2")
    if args.data:
        from adalayers.data.tasks.shortcut import config_from_args

        cfg = config_from_args(args)
    elif not args.config:
        raise AdaLayersError("give a config file (see configs/), or your data: --data FILE --text COLUMN --label COLUMN")
    else:
        cfg = config.load(args.config, args.overrides)
    if args.seeds is not None or args.ensemble:
        from adalayers.lab import seeds

        if args.resume:
            raise AdaLayersError("--resume: with --seeds, run the same command again (finished seeds are reused)")
        summary = seeds.train_seeds(cfg, Path(args.out), args.seeds or 1, ensemble=args.ensemble)
        print((Path(args.out) / "seeds.md").read_text(encoding="utf-8"))
        print(f"run folders: {', '.join(str(Path(args.out) / r) for r in summary['runs'])}"
              + (f"; ensemble: {Path(args.out) / 'ensemble'}" if args.ensemble else ""))
        return 0
    metrics = recipes.train(cfg, Path(args.out), resume=True if args.resume else None, overwrite=args.overwrite)
    from adalayers.engine import distributed

    if not distributed.is_main():  # under torchrun, rank 0 reports for all
        return 0
    shown = {split: metrics[split] for split in ("validation", "test") if split in metrics}
    print(_dump({**shown, "trainable_params": metrics["trainable_params"],
                 "train_seconds": metrics["train_seconds"]}))
    if "test" not in metrics:
        print("no test split: the numbers above are validation only")
    print(f"run folder: {args.out}")
    return 0


def cmd_evaluate(args) -> int:
    from adalayers.cli import recipes

    from adalayers.store.hub import resolve_run

    try:
        result = recipes.evaluate(resolve_run(args.run), args.split)
    except recipes.ResultNotSaved as e:
        print(_dump(e.result))  # the metrics, then the one-line error, exit code 2
        raise
    print(_dump(result))
    return 0


def cmd_predict(args) -> int:
    from adalayers.cli import recipes

    texts, pairs = list(args.texts), [list(p) for p in args.pair or []]
    if args.file:
        from adalayers.store import run as runlib
        from adalayers.data.tasks import takes_pairs

        from adalayers.data.tasks.tables import iter_lines

        # bytes that are not UTF-8 (or a line over tables.MAX_LINE_BYTES) stop here naming the line
        numbered = [(n, line.rstrip("\r\n")) for n, line in enumerate(iter_lines(Path(args.file)), 1) if line.strip()]
        if takes_pairs(runlib.run_config(Path(args.run))):  # a pair per line: text TAB second text
            bad = [n for n, line in numbered if "\t" not in line]
            if bad:
                raise AdaLayersError(f"{args.file}: line {bad[0]} has no TAB; {args.run} was trained on sentence "
                                     f"pairs: give one pair a line, text TAB second text")
            pairs += [line.split("\t", 1) for _, line in numbered]
        else:
            texts += [line for _, line in numbered]
    if texts and pairs:
        raise AdaLayersError("give single texts or pairs (--pair A B, or TAB-separated lines in --file), not both")
    if not texts and not pairs:
        raise AdaLayersError("give texts as arguments, pairs as --pair A B, or --file FILE (one text, or one "
                             "TAB-separated pair, per line)")
    if pairs:
        texts, text_pairs = [a for a, _ in pairs], [b for _, b in pairs]
    else:
        text_pairs = None
    from adalayers.store.hub import resolve_run

    for r in recipes.predict(resolve_run(args.run), texts, text_pairs=text_pairs):
        shown = r["text"] + (f"\t{r['text_pair']}" if "text_pair" in r else "")
        if args.json:
            print(json.dumps(r))
        elif "label" in r:
            print(f"{r['label']}\t{r['probabilities'][r['label']]:.3f}\t{shown}")
        elif "value" in r:
            print(f"{r['value']:.4f}\t{shown}")
        else:
            print(" ".join(f"{w}/{t}" for w, t in zip(r["words"], r["tags"])))
    return 0


def _dump(obj) -> str:
    """JSON with indent 2, but each confusion matrix on one line."""
    inline: dict[str, str] = {}

    def walk(o):
        if not isinstance(o, dict):
            return o
        out = {}
        for k, v in o.items():
            if k == "confusion":
                inline[f"@confusion{len(inline)}@"] = json.dumps(v)
                v = f"@confusion{len(inline) - 1}@"
            out[k] = walk(v)
        return out

    text = json.dumps(walk(obj), indent=2)
    for key, value in inline.items():
        text = text.replace(f'"{key}"', value)
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adalayers", description=__doc__.splitlines()[0].partition(": ")[2].capitalize())
    parser.add_argument("--verbose", action="store_true", help="also show transformers' own progress bars "
                                                              "(e.g. 'Loading weights')")
    parser.set_defaults(fn=lambda args: _print_help(parser))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("train", help="train a side-task head on a frozen base")
    _add_config_args(p, optional=True)
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from its last completed epoch (automatic when --out "
                        "holds an unfinished run)")
    p.add_argument("--seeds", type=int, metavar="N",
                   help="train N seeds (train.seed, train.seed+1, ...) into OUT/seed_<s>/ and report every metric "
                        "as median and min-max in OUT/metrics.json and OUT/seeds.md")
    p.add_argument("--ensemble", action="store_true",
                   help="with --seeds: also write OUT/ensemble/, a run folder averaging the seeds' probabilities "
                        "(values for regression) from one base pass, and score it")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished run in --out; the old run stays intact until the new one has finished")
    from adalayers.data.tasks.shortcut import add_data_args

    add_data_args(p)  # --data FILE --text COLUMN --label COLUMN ...: your own data without a config
    p.set_defaults(fn=cmd_train, torchrun=True)

    p = sub.add_parser("evaluate", help="score a trained run on its test split (writes eval_<split>.json)")
    p.add_argument("run", help="run folder, or a Hub id user/name[@revision]")
    p.add_argument("--split", default="test", choices=["validation", "test"],
                   help="which split of the run's task to score (default: test)")
    p.set_defaults(fn=cmd_evaluate)

    p = sub.add_parser("predict", help="predict labels for texts with a trained run")
    p.add_argument("run", help="run folder, or a Hub id user/name[@revision]")
    p.add_argument("texts", nargs="*", help="texts to label")
    p.add_argument("--pair", nargs=2, action="append", metavar=("TEXT", "SECOND"),
                   help="a sentence pair, for heads trained on pairs (repeatable)")
    p.add_argument("--file", help="a file of texts, one per line (a head trained on pairs: text TAB second text)")
    p.add_argument("--json", action="store_true", help="one JSON object per text")
    p.set_defaults(fn=cmd_predict)

    for module in COMMAND_MODULES:  # each adds its own sub-commands: add_commands(sub)
        importlib.import_module(module).add_commands(sub)
    _verbose_everywhere(sub)
    return parser


def _print_help(parser: argparse.ArgumentParser) -> int:
    """A command group called without its sub-command: its help, not an argparse error."""
    parser.print_help()
    return 0


def _verbose_everywhere(sub) -> None:
    """--verbose is accepted after any (sub-)command too: `adalayers train ... --verbose`."""
    for p in sub.choices.values():
        if "--verbose" not in p._option_string_actions:
            p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)
        for action in p._subparsers._group_actions if p._subparsers else []:
            _verbose_everywhere(action)


# Commands that run under torchrun (their parsers set torchrun=True): one data-parallel training, or each
# process building its shard of the cache. compare and compare-multitask run each strategy in a process of
# its own and time inference and memory in one, so they are refused there with a one-line message.
TORCHRUN_COMMANDS = ("train", "sweep-layers", "cache build")


def _command_words(argv: list[str] | None) -> list[str]:
    words = []
    for a in sys.argv[1:] if argv is None else argv:
        if a.startswith("-") or len(words) == 2:
            break
        words.append(a)
    return words[:1] if words[:1] != ["cache"] else words


def main(argv: list[str] | None = None) -> int:
    from adalayers.engine import distributed
    from adalayers.engine.progress import setup_logging

    setup_logging()  # messages to stderr; the command's own output stays on stdout
    args = build_parser().parse_args(argv)
    from adalayers import progress

    if distributed.launched() and not getattr(args, "torchrun", False):
        if distributed.is_main():  # every process stops; one says why
            print(f"error: 'adalayers {' '.join(_command_words(argv))}' does not run under torchrun; under torchrun: "
                  f"{', '.join(TORCHRUN_COMMANDS)} (launch this one without torchrun)", file=sys.stderr)
        return 2
    restore = progress.configure(verbose=args.verbose)
    try:
        return args.fn(args)
    except AdaLayersError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        restore()
        distributed.stop()  # leave a torchrun process group cleanly


if __name__ == "__main__":
    sys.exit(main())
