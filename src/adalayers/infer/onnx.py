"""The ONNX runtime: one exported graph (base + every head) run by ONNX Runtime (adalayers.infer.runtime).

    tasks = SideTasks.load("minilm-l6", ["runs/cola", "runs/conll"], runtime="onnx")
    tasks = SideTasks.load("exported/", [], runtime="onnx-int8")     # a folder from `adalayers export`
    tasks = SideTasks.open_export("exported/", int8=True)           # the same, with the folder's options

Tokenization, windows and the shape of each answer are the Predictor's own; only the pass changes:
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
from adalayers.infer.heads import Head
from adalayers.infer.runtime import Runtime
from adalayers.store.head_spec import HeadSpec

log = logging.getLogger(__name__)


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


def export_key(base: str, heads: list[HeadSpec], primary: bool, int8: bool) -> str:
    h = hashlib.sha256(json.dumps([base, primary, int8 and DEFAULT_INT8, torch.__version__]).encode())
    for spec in heads:
        h.update(spec.name.encode())
        for f in ("config.json", runlib.HEAD):
            p = Path(spec.path) / f
            h.update(runlib.sha256(p).encode() if p.is_file() else b"-")
    return h.hexdigest()[:20]


def load(base: str, heads: list[HeadSpec], primary: bool = True, int8: bool = False, threads: int | None = None
         ) -> tuple["OnnxRuntime", list[Head]]:
    """A base and heads' run folders (exported once into the cache, then reused) or an export folder (`base`) ->
    (the runtime, its heads: those named in `heads`, all of the folder's when none are). int8: its int8 graph."""
    names = [h.name for h in heads]
    if (Path(base) / META).is_file():
        folder = Path(base)
    else:
        if not heads:
            raise ModelError("give the heads to export (run folders), or an export folder as the base")
        folder = model_packages.cache_root() / "onnx" / export_key(base, heads, primary, int8)
        if not (folder / META).is_file():
            from adalayers.model.backbone import Backbone

            runlib.read_config(heads[0].path)  # a missing run folder fails here, before the base loads
            export(Backbone.load(base), heads, folder, primary=primary, int8=int8)
    return open_folder(folder, names or None, int8=int8, threads=threads)


def open_folder(folder: Path, names: list[str] | None = None, int8: bool = False, threads: int | None = None,
                graph: str | None = None) -> tuple["OnnxRuntime", list[Head]]:
    """An export folder -> (its runtime, the heads named, or all). `graph`: another .onnx file of the folder
    to run (e.g. an int8 copy made with another scheme)."""
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
    base = OnnxBase(folder, meta)
    heads = []
    for name in names or list(meta["heads"]):
        task, cfg, _ = runlib.load_head(folder / "heads" / name)  # labels, kind, layer weights
        if task.mixer.num_layers != base.num_layers:
            raise ModelError(f"{name}: head expects {task.mixer.num_layers} layers, base has {base.num_layers}")
        heads.append(Head(name, task, folder / "heads" / name, meta["heads"][name]["max_length"],
                          template=Template.of(cfg)))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(folder / file), options, providers=["CPUExecutionProvider"])
    runtime = OnnxRuntime(base, session, "onnx-int8" if int8 else "onnx")
    log.info("ONNX Runtime session on %s (%s)", folder / file, runtime.name)
    return runtime, heads


class OnnxRuntime(Runtime):
    """One InferenceSession.run per batch: the graph's base output (when exported with it) and every head's
    logits. A graph exported with --no-primary has no base output (has_own_output False)."""

    def __init__(self, base: OnnxBase, session, name: str = "onnx"):
        self._base, self.session, self.name = base, session, name
        self.input_names = [i.name for i in session.get_inputs()]
        self.has_own_output = bool(base.meta["primary"])

    @property
    def base(self) -> OnnxBase:
        return self._base

    def forward(self, batch, heads, stop, cancelled=None):  # one graph: it runs whole (not interruptible)
        feeds = {}
        for name in self.input_names:
            value = batch.get(name)
            feeds[name] = (value if value is not None else torch.zeros_like(batch["input_ids"])).numpy()
        wanted = ([EMBEDDING] if stop is None else []) + [output_name(h.name) for h in heads]
        values = dict(zip(wanted, self.session.run(wanted, feeds)))
        own = torch.from_numpy(values[EMBEDDING]) if stop is None else None
        return own, [torch.from_numpy(np.asarray(values[w], dtype=np.float32)) for w in wanted[stop is None:]]

    def own_output(self) -> tuple[str, list[str]]:
        return "embedding", []
