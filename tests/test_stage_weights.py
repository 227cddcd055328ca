"""benchmarks/stage_weights.py: a model packed into small parts comes back as the fp16-rounded model."""
import runpy
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModel

from conftest import ROOT
from tinymodels import tiny_bert


def run_script(monkeypatch, *argv: str) -> None:
    """The script's command line run in this process (runpy, as `python script ...` runs it; no new interpreter)."""
    script = str(ROOT / "benchmarks" / "stage_weights.py")
    monkeypatch.setattr(sys, "argv", [script, *argv])
    runpy.run_path(script, run_name="__main__")


def test_pack_then_unpack_gives_the_fp16_rounded_weights(tmp_path, monkeypatch):
    model = tiny_bert(tmp_path / "model")
    run_script(monkeypatch, "pack", str(model), str(tmp_path / "parts"), "--chunk-mb", "0.1")
    assert len(list((tmp_path / "parts").glob("chunk.*"))) > 1
    run_script(monkeypatch, "unpack", str(tmp_path / "parts"), str(tmp_path / "rebuilt"))
    before, after = load_file(str(model / "model.safetensors")), load_file(str(tmp_path / "rebuilt" / "model.safetensors"))
    assert before.keys() == after.keys()
    for name, t in before.items():
        assert after[name].dtype == t.dtype
        expected = t.to(torch.float16).to(t.dtype) if t.is_floating_point() else t
        assert torch.equal(after[name], expected), name
    assert (tmp_path / "rebuilt" / "tokenizer.json").is_file() and (tmp_path / "rebuilt" / ".complete").is_file()
    AutoModel.from_pretrained(tmp_path / "rebuilt")
