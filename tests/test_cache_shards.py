"""A hidden-state cache built by 2 processes (`cache build --shard i/2`, run at the same time) equals the
one built by 1 process file for file and tensor for tensor; an entry missing a part is refused."""
import os
import subprocess
import sys

import numpy as np
import yaml

from conftest import ROOT, tiny_model, tiny_tokenizer
from test_resume import write_fake_cola


def setup_config(tmp_path):
    model_dir = tmp_path / "tiny-bert"
    tiny_model("bert", len(tiny_tokenizer())).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    write_fake_cola(tmp_path / "data" / "glue" / "CoLA", 160, seed=2)
    cfg = {"task": {"name": "cola", "data_dir": str(tmp_path / "data")},
           "model": {"base": str(model_dir), "max_length": 16},
           "train": {"eval_batch_size": 16, "num_threads": 1, "device": "cpu"},
           "cache": {"enabled": True, "shard_mb": 0.01}}  # ~150 tokens a shard file: several shards a split
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def entries(folder):
    return {p.name: p for p in (folder / "states").iterdir() if p.is_dir() and not p.name.startswith(".")}


def test_two_process_build_equals_one_process_build_and_a_missing_part_is_refused(tmp_path, capsys):
    from adalayers.cli import main

    cfg = setup_config(tmp_path)
    assert main(["cache", "build", str(cfg), "--set", f"cache.dir={tmp_path / 'one'}"]) == 0

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "adalayers", "cache", "build", str(cfg), "--set",
                               f"cache.dir={tmp_path / 'two'}", "--shard", f"{i}/2"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs

    one, two = entries(tmp_path / "one"), entries(tmp_path / "two")
    assert sorted(one) == sorted(two) and len(one) == 3  # train, validation and test of the fake CoLA
    shards = 0
    for key in one:
        files = sorted(f.name for f in one[key].iterdir())
        assert files == sorted(f.name for f in two[key].iterdir())
        shards = max(shards, len({f[:4] for f in files if f.startswith("s")}))
        for name in files:
            if name.endswith(".npy"):
                assert np.array_equal(np.load(one[key] / name), np.load(two[key] / name)), (key, name)
    assert shards >= 4  # the train split really is in several shards, dealt to both processes
    assert not list((tmp_path / "two" / "states").glob(".parts-*"))  # assembled and renamed into place

    capsys.readouterr()
    half = ["--set", f"cache.dir={tmp_path / 'half'}"]
    assert main(["cache", "build", str(cfg), *half, "--shard", "0/2"]) == 0
    assert "part 0/2 written" in capsys.readouterr().out
    assert main(["cache", "build", str(cfg), *half]) == 2  # training or building reads only complete entries
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "incomplete" in error[0] and "--shard 1/2" in error[0], error  # one line
