"""Tiny stand-ins for tests: a random 2-layer BERT with MiniLM's real tokenizer, and tiny datasets
written in the official file layouts (IMDB tarball, CoNLL-2003 4-column files)."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

POS = ["a wonderful film , great acting and a moving story", "i loved it , brilliant and funny<br /><br />see it",
       "superb direction , a joy to watch", "the best movie of the year , truly great",
       "charming , warm and beautifully shot", "an excellent cast and a clever script"]
NEG = ["a dull film , bad acting and a boring story", "i hated it , awful and stupid",
       "terrible direction , a pain to watch", "the worst movie of the year , truly bad",
       "tedious , cold and badly shot", "a weak cast and a lazy script"]


def tiny_bert(folder: Path, layers: int = 2) -> Path:
    """A random BERT (hidden 32) saved with MiniLM's tokenizer: loads through Backbone.load(folder)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from adalayers.model import model_packages

    if (folder / "config.json").is_file():
        return folder
    tok = AutoTokenizer.from_pretrained(str(model_packages.path_for("minilm-l6")))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def imdb_tarball(data_dir: Path, per_class: int = 12, test_per_class: int = 6, extracted: bool = False) -> Path:
    """data_dir/imdb/aclImdb_v1.tar.gz (or an extracted aclImdb/ folder) in the official layout."""
    files = {"aclImdb/README": b"Large Movie Review Dataset v1.0\n", "aclImdb/imdb.vocab": b"the\nfilm\n"}
    for split, n in (("train", per_class), ("test", test_per_class)):
        for polarity, texts, rating in (("pos", POS, 9), ("neg", NEG, 2)):
            for i in range(n):
                files[f"aclImdb/{split}/{polarity}/{i}_{rating}.txt"] = \
                    f"{texts[i % len(texts)]} ( review {split} {i} )".encode()
    folder = data_dir / "imdb"
    folder.mkdir(parents=True, exist_ok=True)
    if extracted:
        for name, raw in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(raw)
        return folder / "aclImdb"
    path = folder / "aclImdb_v1.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, raw in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


CONLL_SENTENCES = [
    ["EU I-ORG", "rejects O", "German I-MISC", "call O", "to O", "boycott O", "British I-MISC", "lamb O", ". O"],
    ["Peter I-PER", "Blackburn I-PER"],
    ["BRUSSELS I-LOC", "1996-08-22 O"],
    ["The O", "European I-ORG", "Commission I-ORG", "said O", "on O", "Thursday O", "it O", "disagreed O"],
    ["Germany I-LOC", "'s O", "representative O", "to O", "the O", "European I-ORG", "Union I-ORG",
     "Werner I-PER", "Zwingmann I-PER", "said O"],
    ["Fischler I-PER", "proposed O", "EU-wide I-MISC", "measures O", "after O", "reports O", "from O",
     "Britain I-LOC", "and O", "France I-LOC"],
]


def conll_files(data_dir: Path, copies: int = 3) -> Path:
    """data_dir/conll2003/eng.{train,testa,testb}: the 4-column layout with -DOCSTART- lines."""
    folder = data_dir / "conll2003"
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for c in range(copies):
        lines += ["-DOCSTART- -X- O O", ""]
        for sent in CONLL_SENTENCES:
            for item in sent:
                word, tag = item.rsplit(" ", 1)
                lines.append(f"{word} NNP I-NP {tag}")
            lines.append("")
    for name in ("eng.train", "eng.testa", "eng.testb"):
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def tiny_config(model_dir: Path, data_dir: Path, task: str, **sections):
    """A CPU-sized config for `task` on the tiny model; keyword sections override fields."""
    from adalayers import config

    kind = "token" if task == "conll2003" else "sequence"
    data = {"task": {"name": task, "data_dir": str(data_dir)},
            "model": {"base": str(model_dir), "max_length": 24},
            "mixer": {"k": 16, "alpha": 8.0, "cutoff": 0.01},
            "head": {"kind": kind, "num_heads": 2, "dim_feedforward": 32},
            "train": {"max_epochs": 2, "batch_size": 8, "eval_batch_size": 16, "device": "cpu", "lr": 3e-3,
                      "num_threads": 1},
            "cache": {"enabled": False}}
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return config.from_dict(data)
