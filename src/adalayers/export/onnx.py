"""Write DIR/ with model.onnx (base + every head), optionally model.int8.onnx, tokenizer files,
export.json (inputs, outputs, labels, base fingerprint, the sha256 of every other file but the heads', run
folders as paths relative to DIR) and heads/<task>/ (each head's config.json and head.safetensors, with
their own checksums, so the folder serves on its own). Opening the folder checks the graph it runs and the
tokenizer files against those sha256 (verify; a missing entry is refused unless trusted, and with a signing
key set the folder's signature is checked: store/trust.py).

torch.onnx.export with dynamic batch and sequence axes, through the TorchScript exporter
(dynamo=False): on these models it gives the same graph as the dynamo exporter in seconds instead
of minutes; the tests run the graph at other batch sizes and lengths than it was traced with. `int8`: ONNX
Runtime's dynamic quantization (onnxruntime.quantization.quantize_dynamic): weights of the base's
MatMul / Gemm nodes stored as int8, activations quantized per batch at run time.

The folder is built beside DIR and moved into place at the end: DIR is never half written.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from adalayers.store import run as runlib
from adalayers.store import trust
from adalayers.store.head_spec import HeadSpec
from adalayers.errors import ModelError, RunError
from adalayers.export.graph import EMBEDDING, OnePassGraph, layer_owner, output_name
from adalayers.export.int8 import DEFAULT_INT8, INT8_SCHEMES, quantize
from adalayers.kinds import TaskKind

log = logging.getLogger(__name__)
META = "export.json"
MODEL, MODEL_INT8 = "model.onnx", "model.int8.onnx"
OPSET = 18


@contextlib.contextmanager
def cut_after(backbone, deepest: int):
    """Temporarily keep only the base's layers 1..deepest (Z_deepest is then its last state)."""
    owner, attr = layer_owner(backbone.model, backbone.layers)
    full = getattr(owner, attr)
    setattr(owner, attr, torch.nn.ModuleList(list(full)[:deepest]))
    try:
        yield
    finally:
        setattr(owner, attr, full)


def example_inputs(backbone, graph: OnePassGraph) -> dict:
    enc = backbone.tokenize(["an example sentence to trace the graph with", "a shorter one"], max_length=32)
    return {name: enc[name] if name in enc else torch.zeros_like(enc["input_ids"]) for name in graph.input_names()}


def export(backbone, heads: list[HeadSpec], out: Path, primary: bool = True, int8: bool = False,
           int8_scheme: str = DEFAULT_INT8) -> dict:
    """Export `backbone` + the heads (each a name and its run folder) to the folder `out`; returns export.json's content."""
    out = Path(out)
    if int8 and int8_scheme not in INT8_SCHEMES:
        raise ModelError(f"int8 scheme {int8_scheme!r}: choose one of {', '.join(INT8_SCHEMES)}")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / META).is_file())):
        raise RunError(f"{out}: exists and is not an export folder; give a new or empty folder")
    names, tasks, metas = [], [], []
    for name, path in ((h.name, h.path) for h in heads):
        if not name.replace("-", "_").isidentifier():
            raise ModelError(f"task name {name!r}: use letters, digits and underscores (NAME=RUN to rename)")
        task, cfg, meta = runlib.load_head(path, backbone)  # refuses a head trained on another base
        names.append(name)
        tasks.append(task.eval())
        metas.append((path, cfg, meta))
    if len(set(names)) != len(names):
        raise ModelError(f"two heads are named alike ({', '.join(names)}); name them apart with NAME=RUN")
    graph = OnePassGraph(backbone, names, tasks, primary).eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        inputs = example_inputs(backbone, graph)
        cut = contextlib.nullcontext() if primary else cut_after(backbone, graph.deepest)
        log.info("exporting %s + %s to ONNX", backbone.name, ", ".join(names))
        with cut, torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(graph, tuple(inputs.values()), str(tmp / MODEL), dynamo=False, opset_version=OPSET,
                              input_names=list(inputs), output_names=graph.output_names(),
                              dynamic_axes={n: {0: "batch", 1: "sequence"} for n in inputs})
        if int8:
            quantize(tmp / MODEL, tmp / MODEL_INT8, int8_scheme)
        backbone.tokenizer.save_pretrained(tmp)
        outputs = ([{"name": EMBEDDING, "kind": "embedding", "shape": ["batch", backbone.hidden_size]}]
                   if primary else [])
        described = {}
        for name, task, (path, cfg, meta) in zip(names, tasks, metas):
            shape = {TaskKind.TOKENS: ["batch", "sequence", len(task.labels)], TaskKind.REGRESSION: ["batch"]}.get(
                task.kind, ["batch", len(task.labels)])
            outputs.append({"name": output_name(name), "task": name, "kind": task.kind, "labels": task.labels,
                            "shape": shape})
            described[name] = {"kind": task.kind, "labels": task.labels, "run": _relative(path, out),
                               "max_length": cfg.model.max_length, "used_layers": task.used_layers()}
            dest = tmp / "heads" / name
            dest.mkdir(parents=True)
            for f in ("config.json", runlib.HEAD, "metrics.json", trust.SIGNATURE):  # a signed run stays signed
                if (Path(path) / f).is_file():
                    shutil.copy2(Path(path) / f, dest / f)
        meta = {"format": "adalayers-onnx/1", "base": {"name": backbone.name, "fingerprint": backbone.fingerprint(),
                                                       "num_layers": backbone.num_layers,
                                                       "hidden_size": backbone.hidden_size},
                "primary": primary, "inputs": list(inputs), "outputs": outputs, "heads": described,
                "layers_in_graph": graph.deepest if not primary else backbone.num_layers - 1,
                "projected_layers": graph.used_layers, "opset": OPSET,
                "files": {"fp32": MODEL, **({"int8": MODEL_INT8} if int8 else {})},
                **({"int8_scheme": {"name": int8_scheme, **asdict(INT8_SCHEMES[int8_scheme])}} if int8 else {}),
                "torch": torch.__version__, "checksums": checksums(tmp)}
        runlib.write_json(tmp / META, meta)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _replace(tmp: Path, out: Path) -> None:
    """Move the finished folder to `out` (an old export there is replaced whole)."""
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def _relative(path, out: Path) -> str:
    """The run folder as seen from the export folder (never an absolute path of the machine that exported)."""
    return os.path.relpath(Path(path).resolve(), Path(out).resolve())


def checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file of an export folder but export.json and the heads (their run folders' own
    checksums cover them), by relative path."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): runlib.sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != META and "heads" not in p.relative_to(folder).parts}


def verify(folder: Path, meta: dict, graph: str) -> None:
    """Refuse an export folder whose files differ from the sha256 in export.json (the graph run, the
    tokenizer files); an export written before checksums existed is loaded with a warning."""
    sums = meta.get("checksums")
    if not isinstance(sums, dict):
        return trust.unverified(Path(folder) / META, "it has no checksums (exported by an older adalayers, or "
                                                     "they were deleted): its graph and tokenizer files")
    trust.check_signature(folder, signed_manifest(meta))
    if graph not in sums:
        trust.unverified(Path(folder) / graph, "it is not in export.json's checksums (added after the export)")
    for name, want in sums.items():
        path = Path(folder) / name
        if name in meta.get("files", {}).values() and name != graph:
            continue  # the other graph (fp32 / int8) is not read
        if not path.is_file():
            raise RunError(f"{path}: missing (export.json lists it); export the folder again")
        if runlib.sha256(path) != want:
            raise RunError(f"{path}: checksum does not match export.json (the file was changed or damaged); "
                           f"export the folder again")


def signed_manifest(meta: dict) -> dict:
    """What `adalayers sign` signs of an export: the checksums of its files, and the sha256 of the rest of
    export.json (its labels, inputs and outputs)."""
    return {**meta.get("checksums", {}), META: runlib.config_digest(meta)}


def read_meta(folder: Path) -> dict:
    path = Path(folder) / META
    if not path.is_file():
        raise RunError(f"{folder}: no {META} (is this a folder written by 'adalayers export'?)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: not valid JSON ({e})") from None
