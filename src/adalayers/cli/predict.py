"""`adalayers predict`: a trained run's outputs for texts, pairs or a file of them."""
from __future__ import annotations

import json
from pathlib import Path

from adalayers.cli.common import add_runtime_arg
from adalayers.errors import AdaLayersError


def cmd_predict(args) -> int:
    from adalayers.recipes import service

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

    for r in service.predict(resolve_run(args.run), texts, text_pairs=text_pairs, runtime=args.runtime):
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


def add_commands(sub) -> None:
    p = sub.add_parser("predict", help="predict labels for texts with a trained run")
    p.add_argument("run", help="run folder, or a Hub id user/name[@revision]")
    p.add_argument("texts", nargs="*", help="texts to label")
    p.add_argument("--pair", nargs=2, action="append", metavar=("TEXT", "SECOND"),
                   help="a sentence pair, for heads trained on pairs (repeatable)")
    p.add_argument("--file", help="a file of texts, one per line (a head trained on pairs: text TAB second text)")
    p.add_argument("--json", action="store_true", help="one JSON object per text")
    add_runtime_arg(p, trains=True)  # the runtimes that run a base alone (adalayers.runtimes)
    p.set_defaults(fn=cmd_predict)
