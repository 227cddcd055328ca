"""`train --seeds N [--ensemble]`: different heads per seed, median and min-max, and ensembles of heads."""
import json
import shutil
import statistics

import pytest
import torch
from safetensors.torch import load_file

from adalayers import cli
from adalayers.store import run as runlib
from adalayers.lab import seeds
from adalayers.data.encoding import encode
from adalayers.model.ensemble import EnsembleTask
from adalayers.recipes.evaluate import row_outputs
from adalayers.infer.sidetasks import SideTasks
from adalayers.model.states import LiveStates
from adalayers.data.tasks import Example

from conftest import tiny_backbone
from runs_util import NER, make_run
from tinymodels import imdb_tarball, tiny_bert


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    model = tiny_bert(root / "model")
    imdb_tarball(root / "data", per_class=12, test_per_class=6)
    return model, root / "data"


def test_seeds_differ_and_are_summarised_as_median_and_range(world, tmp_path, capsys):
    model, data = world
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"task: {{name: imdb, data_dir: {data}}}\nmodel: {{base: {model}, max_length: 12}}\n"
                   "mixer: {k: 16, alpha: 8.0}\nhead: {kind: sequence, num_heads: 2}\n"
                   "train: {max_epochs: 2, batch_size: 8, device: cpu, lr: 3.0e-3, num_threads: 1, seed: 5}\n"
                   "cache: {enabled: false}\n", encoding="utf-8")
    out = tmp_path / "s"
    assert cli.main(["train", str(cfg), "--out", str(out), "--seeds", "3", "--ensemble"]) == 0
    assert "| test | accuracy |" in capsys.readouterr().out
    dirs = [out / f"seed_{s}" for s in (5, 6, 7)]
    heads = [load_file(d / runlib.HEAD) for d in dirs]
    for a, b in ((0, 1), (1, 2), (0, 2)):  # another seed: another initialisation, other weights
        assert any(not torch.equal(heads[a][k], heads[b][k]) for k in heads[a])
    assert [runlib.run_config(d).train.seed for d in dirs] == [5, 6, 7]
    summary = json.loads((out / "metrics.json").read_text())
    per_seed = [json.loads((d / "metrics.json").read_text()) for d in dirs]
    for split in ("validation", "test"):
        for k in ("accuracy", "mcc", "macro_f1"):
            values = [m[split][k] for m in per_seed]
            s = summary["spread"][split][k]
            assert s["values"] == values and s["min"] == min(values) and s["max"] == max(values)
            assert s["median"] == summary[split][k] == statistics.median(values)
    assert summary["train_seconds_total"] == pytest.approx(sum(m["train_seconds"] for m in per_seed), abs=0.05)
    # the ensemble folder is a run folder: evaluate reads it and gets what the seeds command measured
    ens = summary["ensemble"]
    assert ens["members"] == ["seed_5", "seed_6", "seed_7"] and ens["test"]["n"] == 12
    assert cli.main(["evaluate", str(out / "ensemble")]) == 0
    again = json.loads((out / "ensemble" / "eval_test.json").read_text())
    assert again["accuracy"] == pytest.approx(ens["test"]["accuracy"])
    # report on the seeds folder: each run's report and the median (min–max) table
    assert cli.main(["report", str(out), "--top", "2"]) == 0
    md = (out / "report.md").read_text()
    s = summary["spread"]["test"]["accuracy"]
    assert f"| test | accuracy | {s['median']:.4f} | {s['min']:.4f} – {s['max']:.4f} |" in md
    assert all((d / "report.md").is_file() for d in [*dirs, out / "ensemble"])
    # the same call again reuses every finished seed; without --ensemble (each seed keeping the better of head
    # and probe) the seeds kept with train.keep=head are not taken for it
    capsys.readouterr()
    assert cli.main(["train", str(cfg), "--out", str(out), "--seeds", "3", "--ensemble"]) == 0
    assert capsys.readouterr().out.count("is finished, reusing it") == 3
    assert cli.main(["train", str(cfg), "--out", str(out), "--seeds", "3"]) == 2
    assert "train.keep=head and this call asks train.keep=best" in capsys.readouterr().err
    # --keep reaches every seed (it was dropped with --seeds): `--keep head` finds the seeds kept that way
    assert cli.main(["train", str(cfg), "--out", str(out), "--seeds", "3", "--keep", "head"]) == 0
    assert capsys.readouterr().out.count("is finished, reusing it") == 3


def test_ensemble_needs_seeds(world, tmp_path, capsys):
    assert cli.main(["train", "--out", str(tmp_path / "x"), "--ensemble", "--seeds", "1",
                     "--set", "task.name=imdb"]) == 2
    assert "--ensemble: needs --seeds N with N >= 2" in capsys.readouterr().err


@pytest.mark.parametrize("kind, labels", [("sequence", ["neg", "pos"]), ("token", NER), ("regression", ["score"])])
def test_an_ensemble_of_identical_heads_equals_the_head(tokenizer, tmp_path, kind, labels):
    backbone = tiny_backbone("bert", tokenizer)
    one = make_run(tmp_path / "one", backbone, kind, labels, seed=3)
    shutil.copytree(one, tmp_path / "two")
    other = make_run(tmp_path / "other", backbone, kind, labels, seed=4)
    texts = ["john sees the big dog", "the movie was great and she loved it", "bad"]
    examples = [Example(words=t.split()) if kind == "token" else Example(text=t) for t in texts]
    split = encode(examples, tokenizer, 32, kind, labels, "test")
    single, _, _ = runlib.load_head(one, backbone)

    def outputs(task):
        return row_outputs(task, LiveStates(backbone), split, 8, 0)

    def same(a, b):
        return all(torch.allclose(torch.as_tensor(x), torch.as_tensor(y), atol=1e-6) for x, y in zip(a, b))

    want = outputs(single)
    assert same(outputs(EnsembleTask([runlib.load_head(one, backbone)[0], runlib.load_head(tmp_path / "two", backbone)[0]])), want)
    # and it is a real average: with a different second head the outputs move
    mixed = outputs(EnsembleTask([runlib.load_head(one, backbone)[0], runlib.load_head(other, backbone)[0]]))
    assert not same(mixed, want)
    ref = outputs(runlib.load_head(other, backbone)[0])
    for m, a, b in zip(mixed, want, ref):
        if kind == "regression":
            assert m == pytest.approx((a + b) / 2, abs=1e-6)
        else:
            assert torch.allclose(m, (a + b) / 2, atol=1e-6)
    # written as a run folder, it serves from one base pass next to the single head
    ens_dir = tmp_path / "ens"
    meta = runlib.read_config(one)
    runlib.save_config(ens_dir, runlib.run_config(one), labels, backbone, ensemble=["../one", "../two"], kind=kind)
    tasks = SideTasks.from_backbone(backbone, [f"single={one}", f"ens={ens_dir}"])
    r = tasks.predict(texts)
    assert all(_close(row["tasks"]["single"], row["tasks"]["ens"]) for row in r)
    assert meta["labels"] == labels and tasks.describe()[1]["layer_weights"] == tasks.describe()[0]["layer_weights"]


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return abs(a - b) < 1e-5
    return a == b


def test_aggregate_keeps_nested_metrics_in_the_spread():
    ms = [{"test": {"f1": v, "per_class": {"LOC": {"f1": v / 2}}}, "train_seconds": 10.0, "epochs": 3}
          for v in (0.5, 0.9, 0.7)]
    a = seeds.aggregate(ms, [0, 1, 2])
    assert a["test"] == {"f1": 0.7} and a["spread"]["test"]["per_class.LOC.f1"]["max"] == 0.45
    assert a["epochs"] == 3 and a["train_seconds_total"] == 30.0


def test_two_seeds_keep_counts_whole_and_average_the_rest():
    ms = [{"test": {"acc": a}, "trainable_params": 41353, "epochs": e, "train_seconds": t}
          for a, e, t in ((0.5, 3, 10.0), (0.6, 4, 12.0))]
    a = seeds.aggregate(ms, [0, 1])
    assert a["trainable_params"] == 41353 and isinstance(a["trainable_params"], int)  # not 41353.0 in a table
    assert a["epochs"] == 3.5 and a["train_seconds"] == 11.0 and abs(a["test"]["acc"] - 0.55) < 1e-12


def test_sweep_with_seeds_reports_medians_and_ranges(world, tmp_path):
    from adalayers.lab import sweep

    from tinymodels import tiny_config

    model, data = world
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 1}, model={"max_length": 12})
    r = sweep.run_sweep(cfg, tmp_path / "sw", layers="1", seeds=2)
    assert r["seeds"] == 2
    for e, folder in ((r["layers"][0], "layer_1"), (r["adalayers"], "adalayers")):
        tests = [json.loads((tmp_path / "sw" / folder / f"seed_{s}" / "metrics.json").read_text())["test"]["accuracy"]
                 for s in (0, 1)]
        assert e["test_main"] == statistics.median(tests)
        assert (e["spread"]["test"]["min"], e["spread"]["test"]["max"]) == (min(tests), max(tests))
    md = (tmp_path / "sw" / "sweep.md").read_text()
    assert "2 seeds: medians, min–max in brackets" in md
    assert seeds.cell(r["layers"][0]["spread"]["test"]) in md
