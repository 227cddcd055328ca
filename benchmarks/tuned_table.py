"""The results table of benchmarks/tuned_results.sh, from its output folder: OUT/results.md.

    python benchmarks/tuned_table.py OUT

Rows: the thesis settings (OUT/sweep/adalayers), the tuned settings and their 3-seed ensemble (OUT/tuned, with
the search's trial count and time from OUT/tune), the best single layer chosen on validation (OUT/sweep; when the
sweep left layers out, the row names the layers it chose among). A row whose runs are missing says so instead
of a number.
"""
import json
import sys
from pathlib import Path

from adalayers.lab.seeds import cell


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def main(out: Path) -> str:
    thesis, tuned = load(out / "sweep" / "adalayers" / "metrics.json"), load(out / "tuned" / "metrics.json")
    sweep, trials = load(out / "sweep" / "sweep.json"), load(out / "tune" / "trials.json")
    main_metric = next((m["main_metric"] for m in (tuned, thesis) if m and "main_metric" in m), "metric")
    missing = "not run (no {})"
    rows = [f"| settings | test {main_metric}: median of 3 seeds (min–max) |", "|---|---|"]
    rows.append("| thesis | " + (cell(thesis["spread"]["test"][main_metric]) if thesis
                                 else missing.format("sweep/adalayers/metrics.json")) + " |")
    searched = "search not run"
    if trials:
        ok = [r for r in trials if r["state"] in ("complete", "pruned")]
        failed = [r for r in trials if r not in ok]
        searched = f"{len(ok)} trials, {sum(r['seconds'] or 0 for r in ok):.0f} s" + (
            f"; {len(failed)} failed, {sum(r['seconds'] or 0 for r in failed):.0f} s" if failed else "")
    rows.append(f"| tuned ({searched}) | " + (cell(tuned["spread"]["test"][main_metric]) if tuned
                                              else missing.format("tuned/metrics.json")) + " |")
    rows.append("| tuned + 3-seed ensemble | " + (f"{tuned['ensemble']['test'][main_metric]:.4f}"
                                                  if tuned and "ensemble" in tuned else
                                                  missing.format("tuned/ensemble")) + " |")
    if sweep:
        best = next(e for e in sweep["layers"] if e["pin_layer"] == sweep["best_layer"])
        swept = [e["pin_layer"] for e in sweep["layers"]]
        among = "" if len(swept) == sweep["num_layers"] else f" of layers {', '.join(map(str, swept))}"
        rows.append(f"| best single layer ({best['pin_layer']}{among}, on validation) | "
                    f"{cell(best['spread']['test'])} |")
    else:
        rows.append("| best single layer (on validation) | " + missing.format("sweep/sweep.json") + " |")
    table = "\n".join(rows) + "\n"
    (out / "results.md").write_text(table)
    return table


if __name__ == "__main__":
    print(main(Path(sys.argv[1])), end="")
