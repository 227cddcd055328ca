"""A trained run folder read into numpy heads (adalayers.infer.numpy_heads), without importing torch.

    task = load_task(Path("runs/cola_gemma"))          # config.json checked, head.safetensors read as numpy
    task = task_from_state(cfg, labels, state, bos)   # the same from a state dict of numpy arrays

The run folder is the one training wrote (adalayers.store.run): config.json (the Config, labels, base, checksums)
and head.safetensors (the trainable parameters: mixer.p, mixer.proj.i.weight, head.*). The same checks as
run.load_head where they need no torch: the head file's sha256 against config.json, finite weights, every
tensor the config asks for present and of its shape; a seed ensemble loads its members.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from adalayers.errors import RunError
from adalayers.kinds import TaskKind
from adalayers.infer.numpy_heads import EncoderLayer, ProbeHead, SequenceHead, Task, TokenHead, layer_weights
from adalayers.store import run as runlib


def load_task(run_dir: Path, base=None) -> tuple[Task, object, dict]:
    """(the numpy Task, its Config, config.json's dict) of a run folder, with run.load_head's checks (config.json
    and its digest, the head file's checksum, finite weights, every tensor present and of its shape; `base`: its
    fingerprint() must be the one the head was trained on); a seed ensemble loads its members."""
    run_dir = Path(run_dir)
    meta = runlib.read_config(run_dir)
    cfg = runlib.run_config(run_dir, meta)
    if base is not None:
        runlib.check_base(run_dir, meta, base)
    if meta.get("ensemble"):
        return ensemble([load_task(run_dir / m, base)[0] for m in meta["ensemble"]]), cfg, meta
    path = runlib.head_file(run_dir, meta)
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:  # bytes read here, as run.load_head does (a path that is not valid UTF-8)
        state = load(path.read_bytes())
    except (SafetensorError, OSError) as e:
        raise RunError(f"{path}: not a readable safetensors file ({e})") from None
    broken = [n for n, t in state.items() if t.dtype.kind == "f" and not np.isfinite(t).all()]
    if broken:
        raise RunError(f"{path}: weights that are not finite (NaN or infinity) in {', '.join(broken[:3])}")
    trained = meta["base"]
    return task_from_state(cfg, meta["labels"], state, trained.get("adds_bos", False), trained["num_layers"],
                           trained["hidden_size"], where=str(path)), cfg, meta


def ensemble(members: list[Task]) -> Task:
    """A seed ensemble of members of one kind and labels (EnsembleTask's mean of their probabilities)."""
    first = members[0]
    if any(m.kind != first.kind or m.labels != first.labels for m in members):
        raise RunError("ensemble members differ in kind or labels")
    return Task(first.kind, first.labels, np.mean([m.weights for m in members], 0), first.proj, first.head, first.skip_bos, first.positional,
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
    w = layer_weights(get("mixer.p", (num_layers,)), m.alpha, m.cutoff, m.pin_layer, m.max_layer)
    if h.type == "probe":  # one identity W shared by every layer (model.mixer.probe_projection), saved once
        shared = next((n for n in state if n.startswith("mixer.proj.")), "mixer.proj.0.weight")
        proj = {i: get(shared, (k, hidden_size)) for i in range(num_layers) if w[i] != 0}
    else:
        proj = {i: get(f"mixer.proj.{i}.weight", (k, hidden_size)) for i in range(num_layers) if w[i] != 0}
    scale = (h.target_mean or 0.0, h.target_std or 1.0) if kind == TaskKind.REGRESSION else None
    if h.type == "probe":
        head = (TokenHead([], get("head.out.weight"), get("head.out.bias")) if kind == TaskKind.TOKENS
                else ProbeHead(get("head.out.weight"), get("head.out.bias"), h.pooling, scale))
    elif kind == TaskKind.TOKENS:
        head = TokenHead([_encoder_layer(get, f"head.encoder.layers.{j}.", h.num_heads)
                          for j in range(h.encoder_layers)], get("head.out.weight"), get("head.out.bias"))
    else:
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
