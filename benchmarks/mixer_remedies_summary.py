"""Issue 40's decision table: every remedy on every cell, from the folders benchmarks/mixer_remedies.py kept.

    python benchmarks/mixer_remedies_summary.py "mpnet-base CoLA=benchmarks/results/mixer_remedies" \
        "MiniLM CoLA=benchmarks/results/mixer_remedies_minilm" ...

Each argument is LABEL=FOLDER, FOLDER holding a results.json of benchmarks/mixer_remedies.py. For every cell: the
old default, the best single layer (of the cell's pinned rows, the one with the highest validation median) and
every other row, as test median (min-max) over the seeds and the difference of medians to the best layer.
Then the issue's rule for a new default, applied to each remedy (rows with 3 or more seeds only):

    level with the best single layer  its test median >= the best layer's lowest seed, on every cell
    no loss where the mixer wins      its test median >= the old default's median minus the old default's
                                      spread (max - min), on every cell where the old default's median is
                                      above the best layer's

A remedy becomes the default only if it passes both on every cell. A cell where a remedy was not run fails it.

    --beside "LABEL=FOLDER"      a cell shown in the table and judged by the same rule, but apart: outside the
                                 issue's table (a pair task, a task of many classes), it does not decide.
    --sweep "LABEL=SWEEP_JSON"   a cell's old default and single layers from a 3-seed sweep.json (adalayers
                                 sweep-layers --seeds 3): its layers become rows layerN and its AdaLayers run the
                                 row default, each where the cell's folder has none with as many seeds. The cell
                                 needs no folder of its own (its remedies then come from LABEL=FOLDER, if given).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from adalayers.lab.seeds import cell as spread_cell


def load(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))


def sweep_rows(sweep: dict) -> dict:
    """The rows of a sweep.json with seeds: layerN for each single layer, default for its AdaLayers run."""
    def as_row(run: dict) -> dict:
        spread = run["spread"]
        return {"settings": f"base {sweep['base']}, pin_layer {run.get('pin_layer')}, from sweep.json",
                "seeds": list(range(sweep["seeds"])), "metric": sweep["metric"], "test": spread["test"],
                "validation": spread["validation"]}
    rows = {f"layer{run['pin_layer']}": as_row(run) for run in sweep["layers"]}
    return {**rows, "default": as_row(sweep["adalayers"])}


def add_sweep(rows: dict, sweep: dict) -> dict:
    """`rows` with the sweep's rows put in where it has none with as many seeds."""
    out = dict(rows)
    for name, r in sweep_rows(sweep).items():
        if name not in out or len(out[name]["seeds"]) < len(r["seeds"]):
            out[name] = r
    return out


def pinned(row: dict) -> int | None:
    part = row["settings"].split("pin_layer ")[1].split(",")[0]
    return None if part == "None" else int(part)


def best_layer(rows: dict) -> str | None:
    """The pinned row of highest validation median, among those with the most seeds (a 1-seed row beside
    3-seed rows does not become the cell's reference)."""
    layers = [n for n, r in rows.items() if pinned(r) is not None]
    most = max((len(rows[n]["seeds"]) for n in layers), default=0)
    layers = [n for n in layers if len(rows[n]["seeds"]) == most]
    return max(layers, key=lambda n: rows[n]["validation"]["median"], default=None)


def verdict(name: str, cells: dict[str, dict]) -> tuple[bool, list[str]]:
    """Does row `name` pass the rule on every cell? And why not, cell by cell."""
    reasons = []
    for label, rows in cells.items():
        row, default, layer = rows.get(name), rows.get("default"), best_layer(rows)
        if row is None or len(row["seeds"]) < 3:
            reasons.append(f"{label}: not run over 3 seeds")
            continue
        if default is None or layer is None:
            reasons.append(f"{label}: no default or single-layer row to compare with")
            continue
        med, lay = row["test"]["median"], rows[layer]["test"]
        if med < lay["min"]:
            reasons.append(f"{label}: {med:.4f} below {layer}'s lowest seed {lay['min']:.4f}")
        d = default["test"]
        if d["median"] > lay["median"] and med < d["median"] - (d["max"] - d["min"]):
            reasons.append(f"{label}: {med:.4f} more than a seed spread below the old default {d['median']:.4f}")
    return not reasons, reasons


def table(cells: dict[str, dict], beside: dict[str, dict] | None = None) -> str:
    beside = beside or {}
    judged, cells = cells, {**cells, **beside}
    metric = {label: next(iter(rows.values()))["metric"] for label, rows in cells.items()}
    names = []
    for rows in cells.values():
        names += [n for n in rows if n not in names and n != "default" and pinned(rows[n]) is None]
    head = "| row | " + " | ".join(f"{label} (test {metric[label]})" for label in cells) + " |"
    md = [head, "|---" * (len(cells) + 1) + "|"]

    def line(title: str, pick) -> str:
        out = []
        for rows in cells.values():
            name = pick(rows)
            if name is None or name not in rows:
                out.append("not run")
                continue
            r, text = rows[name], spread_cell(rows[name]["test"])
            if len(r["seeds"]) < 3:
                text += f" ({len(r['seeds'])} seed{'s' if len(r['seeds']) > 1 else ''})"
            layer = best_layer(rows)
            if layer and name != layer:
                text += f"; {r['test']['median'] - rows[layer]['test']['median']:+.4f}"
            out.append(text)
        return f"| {title} | " + " | ".join(out) + " |"

    md.append(line("old default", lambda rows: "default"))
    md.append(line("best single layer (on validation; named below)", best_layer))
    for name in names:
        md.append(line(name, lambda rows, n=name: n))
    layer_names = " / ".join(f"{label}: {best_layer(rows) or '-'}" for label, rows in cells.items())
    md += ["", f"Best single layer per cell: {layer_names}.", "", "The rule for a new default (3 seeds on every cell):", ""]
    for name in ["default", *names]:
        text = said(*verdict(name, judged), "passes on every cell", "fails: ")
        if beside:
            text += "; beside the rule, " + said(*verdict(name, beside), "passes", "fails: ")
        md.append(f"- {name}: {text}")
    return "\n".join(md) + "\n"


def said(ok: bool, why: list[str], passes: str, fails: str) -> str:
    missing = [w.split(":")[0] for w in why if w.endswith("not run over 3 seeds")]
    measured = [w for w in why if not w.endswith("not run over 3 seeds")]
    return passes if ok else fails + "; ".join(measured + ([f"not run over 3 seeds on {', '.join(missing)}"]
                                                           if missing else []))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+", metavar="LABEL=FOLDER")
    ap.add_argument("--beside", action="append", default=[], metavar="LABEL=FOLDER")
    ap.add_argument("--sweep", action="append", default=[], metavar="LABEL=SWEEP_JSON")
    args = ap.parse_args()
    cells, beside = {}, {}
    for arg, into in [(a, cells) for a in args.cells] + [(a, beside) for a in args.beside]:
        label, sep, folder = arg.partition("=")
        if not sep or not (Path(folder) / "results.json").is_file():
            raise SystemExit(f"mixer_remedies_summary: {arg!r} is not LABEL=FOLDER with FOLDER/results.json")
        into[label] = load(Path(folder))
    for arg in args.sweep:
        label, sep, path = arg.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"mixer_remedies_summary: --sweep {arg!r} is not LABEL=SWEEP_JSON with a file")
        sweep = json.loads(Path(path).read_text(encoding="utf-8"))
        if not sweep.get("seeds") or "spread" not in sweep.get("adalayers", {}):
            raise SystemExit(f"mixer_remedies_summary: {path} is a sweep without seeds (no spread to compare)")
        cells[label] = add_sweep(cells.get(label, {}), sweep)
    print(table(cells, beside), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
