"""A trained run folder read into numpy heads (adalayers.infer.numpy_heads), without importing torch.

    task = load_task(Path("runs/cola_gemma"))          # config.json checked, head.safetensors read as numpy
    task = task_from_state(cfg, labels, state, bos)   # the same from a state dict of numpy arrays

The run folder is the one training wrote (adalayers.store.run): config.json (the Config, labels, base, checksums)
and head.safetensors (the trainable parameters: mixer.p, mixer.proj.i.weight, head.*). The same checks as
run.load_head where they need no torch: the head file's sha256 against config.json, finite weights, every
tensor the config asks for present and of its shape; a seed ensemble loads its members.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from adalayers import config as config_mod
from adalayers.errors import ConfigError, RunError
from adalayers.files import sha256
from adalayers.kinds import TaskKind
from adalayers.infer.numpy_heads import EncoderLayer, SequenceHead, Task, TokenHead, layer_weights

HEAD = "head.safetensors"


def read_meta(run_dir: Path) -> dict:
    """config.json of a run folder as a dict (a one-line RunError when missing or unreadable)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise RunError(f"{run_dir}: no config.json (is this a run folder from 'adalayers train'?)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise RunError(f"{path}: not a valid run config ({type(e).__name__})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict) or "base" not in meta:
        raise RunError(f"{path}: not a valid run config (no config or base)")
    return meta


def load_task(run_dir: Path) -> tuple[Task, object, dict]:
    """(the numpy Task, its Config, config.json's dict) of a run folder."""
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    try:
        cfg = config_mod.from_dict(meta["config"])
    except ConfigError as e:
        raise RunError(f"{run_dir / 'config.json'}: {str(e).splitlines()[0]}") from None
    if meta.get("ensemble"):
        return ensemble([load_task(run_dir / m)[0] for m in meta["ensemble"]]), cfg, meta
    path = run_dir / HEAD
    if not path.is_file():
        raise RunError(f"{run_dir}: {HEAD} is missing (training never saved a checkpoint?)")
    if sha256(path) != (meta.get("checksums") or {}).get(HEAD):
        raise RunError(f"{path}: checksum does not match config.json (the file was changed or damaged)")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise RunError(f"{path}: not a readable safetensors file ({e})") from None
    broken = [n for n, t in state.items() if t.dtype.kind == "f" and not np.isfinite(t).all()]
    if broken:
        raise RunError(f"{path}: weights that are not finite (NaN or infinity) in {', '.join(broken[:3])}")
    base = meta["base"]
    return task_from_state(cfg, meta["labels"], state, base.get("adds_bos", False), base["num_layers"],
                           base["hidden_size"], where=str(path)), cfg, meta


def ensemble(members: list[Task]) -> Task:
    """A seed ensemble of members of one kind and labels (EnsembleTask's mean of their probabilities)."""
    first = members[0]
    if any(m.kind != first.kind or m.labels != first.labels for m in members):
        raise RunError("ensemble members differ in kind or labels")
    return Task(first.kind, first.labels, first.weights, first.proj, first.head, first.skip_bos, first.positional,
                first.gelu_after_sum, list(members))


def task_from_state(cfg, labels: list[str], state: dict, bos: bool, num_layers: int, hidden_size: int,
                    where: str = "head") -> Task:
    """A Task from the trainable parameters of a SideTask (numpy arrays, as head.safetensors holds them)."""
    def get(name: str, shape: tuple | None = None) -> np.ndarray:
        if name not in state:
            raise RunError(f"{where}: tensor {name} is missing (the file does not fit its config)")
        t = np.ascontiguousarray(state[name], dtype=np.float32)
        if shape is not None and t.shape != shape:
            raise RunError(f"{where}: tensor {name} has shape {t.shape}, the config asks for {shape}")
        return t

    m, h, k = cfg.mixer, cfg.head, cfg.mixer.k
    kind = TaskKind.parse(h.kind or TaskKind.CLASSIFICATION, "head.kind")
    w = layer_weights(get("mixer.p", (num_layers,)), m.alpha, m.cutoff, m.pin_layer)
    proj = {i: get(f"mixer.proj.{i}.weight", (k, hidden_size)) for i in range(num_layers) if w[i] != 0}
    if kind == TaskKind.TOKENS:
        head = TokenHead([_encoder_layer(get, f"head.encoder.layers.{j}.", h.num_heads)
                          for j in range(h.encoder_layers)], get("head.out.weight"), get("head.out.bias"))
    else:
        scale = (h.target_mean or 0.0, h.target_std or 1.0) if kind == TaskKind.REGRESSION else None
        head = SequenceHead(h.num_heads, get("head.attn.in_proj_weight", (3 * k, k)), get("head.attn.in_proj_bias"),
                            get("head.attn.out_proj.weight", (k, k)), get("head.attn.out_proj.bias"),
                            get("head.out.weight"), get("head.out.bias"), h.pooling, scale)
    skip_bos = bos if h.skip_bos is None else bool(h.skip_bos)
    return Task(kind, list(labels), w, proj, head, skip_bos, m.positional, m.gelu_after_sum)


def _encoder_layer(get, p: str, num_heads: int) -> EncoderLayer:
    return EncoderLayer(num_heads, (get(p + "norm1.weight"), get(p + "norm1.bias")),
                        get(p + "self_attn.in_proj_weight"), get(p + "self_attn.in_proj_bias"),
                        get(p + "self_attn.out_proj.weight"), get(p + "self_attn.out_proj.bias"),
                        (get(p + "norm2.weight"), get(p + "norm2.bias")), get(p + "linear1.weight"),
                        get(p + "linear1.bias"), get(p + "linear2.weight"), get(p + "linear2.bias"))
