"""The table of benchmarks/pair_decoder.sh, from its output folder: OUT/results.md and OUT/results.json.

    python benchmarks/pair_decoder.py OUT [--base gemma3-270m] [--keep benchmarks/results/pair_decoder]

One row per head's folder (OUT/<row>/, an `adalayers train --seeds N` folder: AdaLayers, or pinned to one layer
as OUT/<encoding>_layer<i>/): test and validation
MCC and accuracy as median (min-max) over its seeds, the best epochs and the layer weights of the kept epoch
(median over the seeds); then the linear probes of each encoding (benchmarks/results/probes_qqp_<base>_qqp_<enc>.json):
the best mean-pooled and last-token layer chosen on validation MCC, and all layers concatenated.
"""
import argparse
import json
from pathlib import Path

from adalayers.lab.seeds import cell

HERE = Path(__file__).resolve().parent
ROWS = {"bos_mean": ("the tokenizer's pair encoding (a second BOS between the texts)", "mean"),
        "bos_last": ("the tokenizer's pair encoding (a second BOS between the texts)", "last"),
        "joined_mean": ("one text, joined by a newline (task.pair_separator)", "mean"),
        "joined_last": ("one text, joined by a newline (task.pair_separator)", "last")}
PROBES = {"bos": ROWS["bos_mean"][0], "joined": ROWS["joined_mean"][0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--keep", type=Path, metavar="DEST",
                    help="copy the table and its JSON to DEST (each run's files stay in OUT)")
    args = ap.parse_args()
    out, data = args.out, {"heads": {}, "probes": {}}
    md = [f"QQP on {args.base} (benchmarks/pair_decoder.sh; settings in each run's config.json and in the probes' "
          "JSON). MCC and accuracy on the test subset; median (min-max) over the seeds.", "",
          "| model | how the pair reaches the base | pooling | test MCC | test accuracy | validation MCC | "
          "best epochs | largest layer weights (layer: weight) |", "|---|---|---|---|---|---|---|---|"]
    layers = sorted((d.name for d in out.glob("*_layer*") if (d / "metrics.json").is_file()),
                    key=lambda n: (n.split("_layer")[0], int(n.split("_layer")[1])))
    rows = {**ROWS, **{n: (ROWS[n.split("_layer")[0] + "_mean"][0], "mean") for n in layers}}
    for name, (encoding, pooling) in rows.items():
        path = out / name / "metrics.json"
        if not path.is_file():
            continue
        m = json.loads(path.read_text())
        spread = m["spread"]
        best = [int(x) for x in spread["best_epoch"]["values"]] if "best_epoch" in spread else []
        weights = m.get("layer_weights") or []
        top = [i for i in sorted(range(len(weights)), key=lambda i: -weights[i])[:4] if weights[i] > 0]
        data["heads"][name] = {"encoding": encoding, "pooling": pooling, "seeds": m["seeds"],
                                   "test": {k: spread["test"][k] for k in ("mcc", "accuracy")},
                                   "validation_mcc": spread["validation"]["mcc"], "best_epochs": best,
                                   "layer_weights": weights}
        model = f"the same head on layer {name.split('_layer')[1]} alone" if "_layer" in name else "AdaLayers"
        md.append(f"| {model} | {encoding} | {pooling} | {cell(spread['test']['mcc'])} | "
                  f"{cell(spread['test']['accuracy'])} | {cell(spread['validation']['mcc'])} | "
                  f"{', '.join(map(str, best))} | " + ", ".join(f"{i}: {weights[i]:.2f}" for i in top) + " |")
    for enc, encoding in PROBES.items():
        path = HERE / "results" / f"probes_qqp_{args.base}_qqp_{enc}.json"
        if not path.is_file():
            continue
        p = json.loads(path.read_text())
        data["probes"][enc] = {k: p[k] for k in ("best_mean", "best_last", "concat")}
        for kind, label in (("best_mean", "mean-pooled"), ("best_last", "last token")):
            b = p[kind]
            md.append(f"| linear probe, layer {b['layer']} (chosen on validation) | {encoding} | {label} | "
                      f"{b['test']:.4f} | | {b['validation']:.4f} | | |")
        c = p["concat"]
        md.append(f"| linear probe, all layers concatenated | {encoding} | mean-pooled | {c['test']:.4f} | | "
                  f"{c['validation']:.4f} | | |")
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    text = "\n".join(md) + "\n"
    (out / "results.md").write_text(text)
    print(text)
    if args.keep:
        from mixer_remedies import keep  # benchmarks/mixer_remedies.py: the same copy, paths made portable

        keep(out, args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
