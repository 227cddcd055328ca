"""benchmarks/mixer_remedies_summary.py: issue 40's rule for a new default, on made-up cells."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "mixer_remedies_summary", Path(__file__).resolve().parents[1] / "benchmarks" / "mixer_remedies_summary.py")
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)


def row(pin, test, validation=0.5, seeds=3):
    lo, med, hi = test
    return {"settings": f"base b, alpha 64.0, cutoff 0.01, pin_layer {pin}, layer_dropout 0.0", "seeds": list(range(seeds)),
            "metric": "mcc", "test": {"median": med, "min": lo, "max": hi, "values": [lo, med, hi][:seeds]},
            "validation": {"median": validation, "min": validation, "max": validation, "values": [validation] * seeds}}


def test_a_remedy_must_reach_the_best_layers_lowest_seed_and_keep_the_mixers_wins():
    loses = {"default": row(None, (0.48, 0.50, 0.52)), "layer3": row(3, (0.55, 0.56, 0.57), validation=0.6),
             "layer5": row(5, (0.40, 0.60, 0.61), validation=0.4),  # higher test, chosen on validation: not it
             "a": row(None, (0.54, 0.555, 0.56)), "b": row(None, (0.50, 0.549, 0.60))}
    wins = {"default": row(None, (0.30, 0.32, 0.34)), "layer2": row(2, (0.25, 0.28, 0.29)),
            "a": row(None, (0.27, 0.29, 0.30)), "b": row(None, (0.29, 0.33, 0.35))}
    cells = {"loses": loses, "wins": wins}
    assert summary.best_layer(loses) == "layer3"
    assert summary.verdict("default", cells) == (False, ["loses: 0.5000 below layer3's lowest seed 0.5500"])
    # a: level with layer 3 (0.555 >= 0.55), but 0.03 below the default where the mixer wins (spread 0.04: allowed)
    assert summary.verdict("a", cells) == (True, [])
    ok, why = summary.verdict("b", cells)
    assert not ok and why == ["loses: 0.5490 below layer3's lowest seed 0.5500"]
    wins["a"] = row(None, (0.20, 0.27, 0.30))  # 0.05 below the default: more than its spread (0.04)
    assert summary.verdict("a", cells)[1] == ["wins: 0.2700 more than a seed spread below the old default 0.3200"]
    del wins["a"]
    assert summary.verdict("a", cells)[1] == ["wins: not run over 3 seeds"]
    loses["c"], wins["c"] = row(None, (0.6, 0.6, 0.6), seeds=1), row(None, (0.4, 0.4, 0.4))
    assert summary.verdict("c", cells)[1] == ["loses: not run over 3 seeds"]
    text = summary.table(cells)
    assert "| a | 0.5550 (0.5400–0.5600); -0.0050 | not run |" in text
    assert "- a: fails: not run over 3 seeds on wins" in text
    assert "- b: fails: loses: 0.5490 below layer3's lowest seed 0.5500" in text


def test_a_sweep_with_seeds_fills_in_the_old_default_and_the_single_layers():
    spread = lambda lo, med, hi, v: {"test": {"median": med, "min": lo, "max": hi, "values": [lo, med, hi]},  # noqa: E731
                                     "validation": {"median": v, "min": v, "max": v, "values": [v] * 3}}
    sweep = {"base": "b", "seeds": 3, "metric": "f1",
             "layers": [{"pin_layer": 5, "spread": spread(0.84, 0.85, 0.86, 0.89)},
                        {"pin_layer": 7, "spread": spread(0.86, 0.87, 0.88, 0.88)}],
             "adalayers": {"pin_layer": None, "spread": spread(0.85, 0.855, 0.86, 0.90)}}
    folder = {"default": row(None, (0.8, 0.8, 0.8), seeds=1), "uniform": row(None, (0.85, 0.851, 0.86))}
    rows = summary.add_sweep(folder, sweep)
    assert rows["default"]["seeds"] == [0, 1, 2] and rows["uniform"] is folder["uniform"]
    assert summary.best_layer(rows) == "layer5"  # chosen on validation, not test
    # 0.851: level with layer 5 (lowest 0.84), inside the default's spread (0.855 - 0.01)
    assert summary.verdict("uniform", {"cell": rows}) == (True, [])
    rows["uniform"] = row(None, (0.83, 0.84, 0.85))
    assert summary.verdict("uniform", {"cell": rows})[1] == [
        "cell: 0.8400 more than a seed spread below the old default 0.8550"]


def test_a_cell_beside_the_rule_is_shown_and_judged_apart():
    rule = {"default": row(None, (0.30, 0.32, 0.34)), "layer2": row(2, (0.25, 0.28, 0.29)),
            "a": row(None, (0.30, 0.31, 0.33))}
    pair = {"default": row(None, (0.40, 0.41, 0.42)), "layer9": row(9, (0.50, 0.52, 0.53)),
            "a": row(None, (0.45, 0.47, 0.48))}
    text = summary.table({"rule": rule}, {"pair": pair})
    assert "| a | 0.3100 (0.3000–0.3300); +0.0300 | 0.4700 (0.4500–0.4800); -0.0500 |" in text
    assert "- a: passes on every cell; beside the rule, fails: pair: 0.4700 below layer9's lowest seed 0.5000" in text
