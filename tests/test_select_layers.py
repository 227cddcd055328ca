"""`adalayers train --select-layers K`: the mixer and its K most favoured single layers, the best on validation
kept as the run (tiny runs of a random 2-layer BERT)."""
import json
from pathlib import Path

import pytest
import yaml

from adalayers import cli
from adalayers.recipes import service
from adalayers.errors import ConfigError
from adalayers.recipes import select
from adalayers.recipes.select import Candidate, candidate_layers, choose, peak_weights

from tinymodels import imdb_tarball, tiny_bert, tiny_config


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    model = tiny_bert(root / "model")
    imdb_tarball(root / "data", per_class=12, test_per_class=6)
    return model, root / "data"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("ADALAYERS_DATA", raising=False)


def test_peaks_are_taken_up_to_the_best_epoch_and_rank_the_layers():
    log = [{"epoch": 1, "layer_weights": [0.1, 0.6, 0.3]},
           {"epoch": 2, "layer_weights": [0.2, 0.3, 0.5]},
           {"epoch": 3, "layer_weights": [0.9, 0.05, 0.05]}]  # after the best epoch: not counted
    assert peak_weights(log, best_epoch=2) == [0.2, 0.6, 0.5]
    assert peak_weights(log, best_epoch=None) == [0.9, 0.6, 0.5]
    assert candidate_layers([0.2, 0.6, 0.5], 2, middle=False) == [1, 2]
    assert candidate_layers([0.5, 0.2, 0.5], 1, middle=False) == [0]  # a tie goes to the lower layer


def test_the_middle_layer_is_a_candidate_even_when_the_mix_left_it():
    """Gemma's QQP mixer, seed 0: its peaks rank 12, 16 and 18 first, while layer 9 (the middle of 19 states)
    is the best single layer; the peaks alone never try it."""
    peaks = [0.06, 0.05, 0.05, 0.05, 0.04, 0.05, 0.05, 0.05, 0.05, 0.066, 0.04, 0.06, 0.333, 0.04, 0.04, 0.04,
             0.259, 0.04, 0.284]
    assert candidate_layers(peaks, 3, middle=False) == [12, 16, 18]
    assert candidate_layers(peaks, 3) == [9, 12, 16, 18]
    assert candidate_layers([0.1, 0.3, 0.6], 2) == [1, 2]  # the middle (1) already ranked: no extra candidate


def test_the_highest_validation_wins_and_a_tie_goes_to_the_mixer_then_the_lower_layer():
    def c(name, pin, val):
        return Candidate(name, name, pin, val, None, 1.0)
    assert choose([c("adalayers", None, 0.5), c("layer 1", 1, 0.6), c("layer 2", 2, 0.55)]).name == "layer 1"
    assert choose([c("layer 2", 2, 0.6), c("adalayers", None, 0.6), c("layer 1", 1, 0.6)]).name == "adalayers"
    assert choose([c("layer 2", 2, 0.6), c("layer 1", 1, 0.6)]).name == "layer 1"


def test_select_layers_trains_the_candidates_keeps_the_best_as_the_run_and_resumes(world, tmp_path, monkeypatch):
    model, data = world
    out = tmp_path / "sel"
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 2})
    trained = []
    real_train = service.train
    monkeypatch.setattr(service, "train", lambda c, o, **kw: trained.append(Path(o).name) or real_train(c, o, **kw))
    s = select.select_layers(cfg, out, 2, command="adalayers train x --select-layers 2")
    assert trained[0] == "adalayers" and sorted(trained[1:]) == sorted(f"layer_{i}" for i in
                                                                     (c["pin_layer"] for c in s["candidates"][1:]))
    # the candidates are the mixer's two largest peak weights up to its best epoch and the middle layer (1 of 3)
    log = [json.loads(x) for x in (out / "candidates/adalayers/log.jsonl").read_text().splitlines()]
    best_epoch = json.loads((out / "candidates/adalayers/metrics.json").read_text())["best_epoch"]
    peaks = peak_weights(log, best_epoch)
    layers = [c["pin_layer"] for c in s["candidates"][1:]]
    assert layers == candidate_layers(peaks, 2) and 1 in layers and s["k"] == 2 and s["middle"] == 1
    assert set(candidate_layers(peaks, 2, middle=False)) <= set(layers) and len(layers) in (2, 3)
    # the winner has the highest validation metric, and OUT is its run, file for file
    vals = {c["name"]: c["validation"] for c in s["candidates"]}
    assert vals[s["chosen"]] == max(vals.values())
    winner = out / s["chosen_folder"]
    for f in winner.iterdir():
        if f.is_file() and not f.name.startswith("selection."):  # the candidate's head against its probe
            assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    assert service.evaluate(out)["mcc"] == json.loads((winner / "metrics.json").read_text())["test"]["mcc"]
    md = (out / "selection.md").read_text(encoding="utf-8")
    assert f"| {s['chosen']} **(chosen)** |" in md and "Chosen: " in md
    assert json.loads((out / "selection.json").read_text())["chosen"] == s["chosen"]
    # a second call reuses every finished candidate
    trained.clear()
    assert select.select_layers(cfg, out, 2)["chosen"] == s["chosen"] and trained == []


def test_select_layers_refuses_what_it_cannot_do(world, tmp_path, capsys):
    model, data = world
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 1})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
    assert cli.main(["train", str(path), "--out", str(tmp_path / "o"), "--select-layers", "0"]) == 2
    assert "--select-layers: must be at least 1" in capsys.readouterr().err
    assert cli.main(["train", str(path), "--out", str(tmp_path / "o"), "--select-layers", "2",
                     "--set", "mixer.pin_layer=1"]) == 2
    assert "leave mixer.pin_layer unset" in capsys.readouterr().err
    assert cli.main(["train", str(path), "--out", str(tmp_path / "o"), "--select-layers", "2", "--seeds", "2"]) == 2
    assert "not with --seeds" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        select.select_layers(cfg, tmp_path / "o", -1)
