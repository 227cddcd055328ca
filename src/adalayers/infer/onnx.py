"""SideTasks answered by ONNX Runtime from one exported graph (base + every head).

    tasks = SideTasks.load("minilm-l6", ["runs/cola", "runs/conll"], backend="onnx")
    tasks = SideTasks.load("exported/", [], backend="onnx-int8")     # a folder from `adalayers export`

Tokenization, windows and the shape of each answer are SideTasks' own; only the pass changes:
one InferenceSession.run per batch instead of the tapped PyTorch pass. Given a base and run
folders (not an export folder), the graph is exported once into the cache
($ADALAYERS_CACHE or ~/.cache/adalayers)/onnx/<key>, the key a hash of the base name, each head's
config.json and head.safetensors, and the options; later loads reuse it.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch

from adalayers.model import model_packages
from adalayers.data.templates import Template
from adalayers.store import run as runlib
from adalayers.errors import ModelError, RunError
from adalayers.export.graph import EMBEDDING, output_name
from adalayers.export.int8 import DEFAULT_INT8
from adalayers.export.onnx import META, export, read_meta, verify
from adalayers.infer.sidetasks import Head, SideTasks, parse_head_arg

log = logging.getLogger(__name__)
BACKENDS = ("torch", "onnx", "onnx-int8")


class OnnxBase:
    """What SideTasks reads of its base, for an exported folder: tokenizer, name, fingerprint, sizes."""

    def __init__(self, folder: Path, meta: dict):
        from transformers import AutoTokenizer

        self.folder, self.meta = folder, meta
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.name = meta["base"]["name"]
        self.num_layers, self.hidden_size = meta["base"]["num_layers"], meta["base"]["hidden_size"]
        self.device = torch.device("cpu")
        self.is_causal = False  # export takes encoder bases only: right padding

    def fingerprint(self) -> str:
        return self.meta["base"]["fingerprint"]


def export_key(base: str, heads: list[tuple[str, Path]], primary: bool, int8: bool) -> str:
    h = hashlib.sha256(json.dumps([base, primary, int8 and DEFAULT_INT8, torch.__version__]).encode())
    for name, path in heads:
        h.update(name.encode())
        for f in ("config.json", runlib.HEAD):
            p = Path(path) / f
            h.update(runlib.sha256(p).encode() if p.is_file() else b"-")
    return h.hexdigest()[:20]


class OnnxSideTasks(SideTasks):
    @classmethod
    def load_onnx(cls, base: str, run_dirs: list, primary: bool = True, backend: str = "onnx",
                  threads: int | None = None, **kw) -> "OnnxSideTasks":
        if backend not in BACKENDS[1:]:
            raise ModelError(f"backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        int8 = backend == "onnx-int8"
        if (Path(base) / META).is_file():
            folder, names = Path(base), [parse_head_arg(str(r))[0] for r in run_dirs]
        else:
            heads = [parse_head_arg(str(r)) for r in run_dirs]
            if not heads:
                raise ModelError("give the heads to export (run folders), or an export folder as the base")
            folder = model_packages.cache_root() / "onnx" / export_key(base, heads, primary, int8)
            names = [n for n, _ in heads]
            if not (folder / META).is_file():
                from adalayers.model.backbone import Backbone

                runlib.read_config(heads[0][1])  # a missing run folder fails here, before the base loads
                export(Backbone.load(base), heads, folder, primary=primary, int8=int8)
        return cls.open(folder, names or None, primary=primary, int8=int8, threads=threads, **kw)

    @classmethod
    def open(cls, folder: Path, names: list[str] | None = None, primary: bool = True, int8: bool = False,
             threads: int | None = None, graph: str | None = None, **kw) -> "OnnxSideTasks":
        """`graph`: another .onnx file of the folder to run (e.g. an int8 copy made with another scheme)."""
        import onnxruntime as ort

        folder = Path(folder)
        meta = read_meta(folder)
        file = graph or meta["files"].get("int8" if int8 else "fp32")
        if file is None or not (folder / file).is_file():
            raise RunError(f"{folder}: has no {file or 'int8 graph'}; export it (with --int8 for int8)")
        verify(folder, meta, file)  # the graph and tokenizer files against export.json's sha256
        unknown = [n for n in names or [] if n not in meta["heads"]]
        if unknown:
            raise ModelError(f"{folder}: no head named {', '.join(unknown)}; it has {', '.join(meta['heads'])}")
        if primary and not meta["primary"]:
            primary = False  # exported with --no-primary: the graph has no base output
        backbone = OnnxBase(folder, meta)
        heads = []
        for name in names or list(meta["heads"]):
            task, cfg, _ = runlib.load_head(folder / "heads" / name)  # labels, kind, layer weights
            if task.mixer.num_layers != backbone.num_layers:
                raise ModelError(f"{name}: head expects {task.mixer.num_layers} layers, base has {backbone.num_layers}")
            heads.append(Head(name, task, folder / "heads" / name, meta["heads"][name]["max_length"],
                              template=Template.of(cfg)))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        side = cls(backbone, heads, primary, **kw)
        side.session = ort.InferenceSession(str(folder / file), options, providers=["CPUExecutionProvider"])
        side.backend = "onnx-int8" if int8 else "onnx"
        side.input_names = [i.name for i in side.session.get_inputs()]
        log.info("ONNX Runtime session on %s (%s)", folder / file, side.backend)
        return side

    def _forward(self, batch: dict, heads: list[Head], stop: int | None):
        feeds = {}
        for name in self.input_names:
            value = batch.get(name)
            feeds[name] = (value if value is not None else torch.zeros_like(batch["input_ids"])).numpy()
        wanted = ([EMBEDDING] if stop is None else []) + [output_name(h.name) for h in heads]
        values = dict(zip(wanted, self.session.run(wanted, feeds)))
        logits = {h.name: torch.from_numpy(np.asarray(values[output_name(h.name)], dtype=np.float32)) for h in heads}
        own = torch.from_numpy(values[EMBEDDING]) if stop is None else None
        return own, logits

    def _base_output(self, out, text, spans, row):
        return None if out is None else {"embedding": out.tolist()}
