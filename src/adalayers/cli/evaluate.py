"""`adalayers evaluate`: score a trained run on a split of its task."""
from __future__ import annotations

from adalayers import runtimes
from adalayers.cli.common import add_runtime_arg, dump


def cmd_evaluate(args) -> int:
    from adalayers.recipes import service

    from adalayers.store.hub import resolve_run

    try:
        result = service.evaluate(resolve_run(args.run), args.split, args.runtime)
    except service.ResultNotSaved as e:
        print(dump(e.result))  # the metrics, then the one-line error, exit code 2
        raise
    print(dump(result))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("evaluate", help="score a trained run on its test split (writes eval_<split>.json)")
    p.add_argument("run", help="run folder, or a Hub id user/name[@revision]")
    p.add_argument("--split", default="test", choices=["validation", "test"],
                   help="which split of the run's task to score (default: test)")
    add_runtime_arg(p, default=None, trains=True,
                    help=f"what runs the base ({runtimes.describe(trains=True)}; default: the runtime the run was "
                         "trained on, its model.runtime)")
    p.set_defaults(fn=cmd_evaluate)
