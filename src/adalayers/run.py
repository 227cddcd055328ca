"""The run folder: everything needed to reuse a trained head, written atomically.

    config.json        resolved config, label names, base model name + fingerprint, file checksums
    head.safetensors   the trainable parameters only
    log.jsonl          one line per epoch
    metrics.json       {"validation": {...}, "test": {...}, "trainable_params", "base_params", "train_seconds"}

Nothing is ever unpickled: weights are safetensors, everything else JSON.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from adalayers import config as config_mod
from adalayers.errors import ConfigError, ModelError, RunError

HEAD = "head.safetensors"


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def append_jsonl(path: Path, obj) -> None:
    """Append a line by rewriting the whole (small) file atomically."""
    old = Path(path).read_text(encoding="utf-8") if Path(path).exists() else ""
    atomic_write(path, old + json.dumps(obj) + "\n")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_head(run_dir: Path, task) -> str:
    """Trainable parameters to head.safetensors; returns the file's sha256."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in task.named_parameters()}
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".head.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp)
        os.replace(tmp, Path(run_dir) / HEAD)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sha256(Path(run_dir) / HEAD)


def save_config(run_dir: Path, cfg, labels: list[str], backbone, head_sha256: str | None = None, **extra) -> None:
    write_json(Path(run_dir) / "config.json", {
        "config": cfg.to_dict(), "labels": labels,
        "base": {"name": backbone.name, "fingerprint": backbone.fingerprint(),
                 "num_layers": backbone.num_layers, "hidden_size": backbone.hidden_size,
                 "adds_bos": bool(getattr(backbone, "adds_bos", False))},
        "checksums": {HEAD: head_sha256} if head_sha256 else {}, **extra})


def read_config(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not run_dir.is_dir():
        raise RunError(f"run folder not found: {run_dir}")
    if not path.is_file():
        raise RunError(f"{run_dir}: no config.json (is this a run folder from 'adalayers train'?)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        for key in ("config", "labels", "base"):
            meta[key]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise RunError(f"{path}: not a valid run config ({e})") from None
    return meta


def run_config(run_dir: Path, meta: dict | None = None):
    """The validated Config a run folder was trained with (no weights are read)."""
    meta = meta or read_config(run_dir)
    try:
        return config_mod.from_dict(meta["config"])
    except ConfigError as e:
        raise RunError(f"{Path(run_dir) / 'config.json'}: {e}") from None


def load_head(run_dir: Path, backbone=None, task=None):
    """Rebuild a trained SideTask from its run folder (checked against the base when one is given).

    `task`: a task built by the caller (e.g. one that also holds upstream heads) to load the weights into.
    """
    from adalayers.sidetask import SideTask

    run_dir = Path(run_dir)
    meta = read_config(run_dir)
    cfg = run_config(run_dir, meta)
    base = meta["base"]
    if backbone is not None and backbone.fingerprint() != base["fingerprint"]:
        raise ModelError(f"{run_dir} was trained on base {base['name']!r} (fingerprint {base['fingerprint']}), "
                         f"but the loaded base is {backbone.name!r} (fingerprint {backbone.fingerprint()})")
    if meta.get("ensemble"):  # a seed ensemble: its members' run folders, relative to this one
        from adalayers.ensemble import EnsembleTask

        members = [load_head(run_dir / m, backbone)[0] for m in meta["ensemble"]]
        task = EnsembleTask(members)
        task.eval()
        return task, cfg, meta
    head_path = run_dir / HEAD
    if not head_path.is_file():
        raise RunError(f"{run_dir}: {HEAD} is missing (training never saved a checkpoint?)")
    expected = meta.get("checksums", {}).get(HEAD)
    if expected and sha256(head_path) != expected:
        raise RunError(f"{head_path}: checksum does not match config.json (the file was changed or damaged)")
    try:
        state = load_file(head_path)
    except (SafetensorError, OSError) as e:
        raise RunError(f"{head_path}: not a readable safetensors file ({e})") from None
    task = task if task is not None else SideTask(cfg, base["num_layers"], base["hidden_size"], meta["labels"],
                                                  bos=base.get("adds_bos", False))
    try:
        missing, unexpected = task.load_state_dict(state, strict=False)
    except RuntimeError as e:
        raise RunError(f"{head_path}: tensors do not fit the config ({str(e).splitlines()[0]})") from None
    missing = [m for m in missing if m in dict(task.named_parameters())]
    if missing or unexpected:
        raise RunError(f"{head_path}: missing {missing or 'nothing'}, unexpected {unexpected or 'nothing'}")
    task.eval()
    return task, cfg, meta

