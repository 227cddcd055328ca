"""The run folder: everything needed to reuse a trained head, written atomically.

    config.json        resolved config, label names, base model name + fingerprint, file checksums
                       (head.safetensors, and config.json's own content: see config_digest)
    head.safetensors   the trainable parameters only
    log.jsonl          one line per epoch
    metrics.json       {"validation": {...}, "test": {...}, "trainable_params", "base_params", "train_seconds"}

Nothing is ever unpickled: weights are safetensors, everything else JSON. config.json is checked
against RunMeta (pydantic, strict types) and its own checksum (labels, template, head and mixer settings:
an edit is refused; a run without that checksum is refused unless unverified runs are trusted:
store/trust.py, which also checks a folder's signature when a signing key is set) before anything in it is used; a head is loaded only when its sha256 matches the one config.json records (a run without it
is refused) and all its weights are finite.
Files are created with the mode the umask allows (0666 & ~umask), as open() would.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from adalayers import config as config_mod
from adalayers.errors import ConfigError, ModelError, RunError
from adalayers.files import (append_jsonl, atomic_write, file_mode, remove_if_empty,  # noqa: F401  (re-exported)
                             sha256, umask, write_json)
from adalayers.jsoncheck import too_deep
from adalayers.kinds import TaskKind
from adalayers.store import trust

HEAD = "head.safetensors"
MAX_CONFIG_DEPTH = 16  # nesting of config.json (a valid one has 4: config.task.label_names.value)
OWNER = ".owner"  # in a `.NAME.new-*` folder of replace_run: "host pid" of the process building it
CONFIG = "config.json"  # also the checksums key of config.json's own content (config_digest)
log = logging.getLogger(__name__)


class BaseInfo(BaseModel):
    model_config = ConfigDict(strict=True)
    name: str = Field(min_length=1)
    fingerprint: str = Field(min_length=1)
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)


class RunMeta(BaseModel):
    """The shape of a run folder's config.json (extra keys such as task, kind, main_metric are kept)."""
    model_config = ConfigDict(strict=True, extra="allow")
    config: dict
    labels: list[str]  # label names; empty for regression
    base: BaseInfo
    checksums: dict[str, str]
    data: dict[str, str] | None = None  # absolute paths of the data training read (see resolved_data)
    ensemble: list[str] | None = Field(None, min_length=1)  # member run folders, each checked when loaded

    @field_validator("labels")
    @classmethod
    def _distinct(cls, labels: list[str]) -> list[str]:
        if len(set(labels)) != len(labels):
            raise ValueError("labels are not distinct")
        return labels

    @model_validator(mode="after")
    def _labels_fit_kind(self) -> "RunMeta":
        kind = self.config.get("head", {}).get("kind") if isinstance(self.config.get("head"), dict) else None
        if kind != TaskKind.REGRESSION and len(self.labels) < 2:
            raise ValueError(f"a {kind or 'classification'} head needs at least 2 labels, got {len(self.labels)}")
        return self

    @model_validator(mode="after")
    def _head_sum(self) -> "RunMeta":
        value = self.checksums.get(HEAD, "")
        if self.ensemble is None and (len(value) != 64 or any(c not in "0123456789abcdef" for c in value)):
            raise ValueError(f"checksums: no sha256 of {HEAD} (a run without it is refused: its weights cannot "
                             f"be checked)")
        return self


def replace_run(out: Path, build) -> dict:
    """Run `build(folder)` on a new temporary folder beside `out`, then swap it in for `out`.

    Until build returns, `out` is untouched (a failed or killed build leaves only a `.NAME.new-*` folder).
    The swap is two renames on one file system: `out` -> `.NAME.old-*`, the new folder -> `out`; then the
    old run is deleted. If the second rename fails the old run is renamed back.
    Under torchrun (a started process group) rank 0 alone makes the new folder, whose name every rank
    is given to build into, and rank 0 alone swaps and deletes; the others wait at barriers."""
    from adalayers.engine import distributed  # torch.distributed: only where a run is written

    out = Path(out)
    new = None
    if distributed.is_main():
        clean_leftovers(out)
        new = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.new-"))
        os.chmod(new, 0o777 & ~umask())
        (new / OWNER).write_text(f"{socket.gethostname()} {os.getpid()}\n", encoding="utf-8")
    new = distributed.broadcast(new)
    try:
        result = build(new)
    except BaseException:
        if distributed.is_main():
            shutil.rmtree(new, ignore_errors=True)
        raise
    distributed.barrier()  # every rank has finished with the new folder
    if distributed.is_main():
        (new / OWNER).unlink(missing_ok=True)
        old = out.parent / f".{out.name}.old-{new.name.rsplit('-', 1)[-1]}"
        os.rename(out, old)
        try:
            os.rename(new, out)
        except BaseException:
            os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()  # no rank returns before `out` holds the new run
    return result


def _alive(owner: Path) -> bool:
    """Is the process named in a `.owner` file (host pid) still running on this host?"""
    try:
        host, pid = owner.read_text(encoding="utf-8").split()
        if host != socket.gethostname():
            return True  # another machine's: not ours to judge
        os.kill(int(pid), 0)
        return True
    except ProcessLookupError:
        return False
    except (OSError, ValueError):
        return not owner.parent.exists() or owner.exists()  # unreadable: leave it alone


def clean_leftovers(out: Path) -> None:
    """What a killed --overwrite left beside `out`: a `.NAME.new-*` folder whose process is gone is removed;
    a `.NAME.old-*` folder is the previous run: renamed back to `out` when the kill came between the two
    renames (`out` missing), else removed (the swap had finished)."""
    out = Path(out)
    for leftover in sorted(out.parent.glob(f".{out.name}.new-*")):
        if leftover.is_dir() and not _alive(leftover / OWNER):
            log.warning("removing %s: the unfinished run of an --overwrite that was interrupted", leftover)
            shutil.rmtree(leftover, ignore_errors=True)
    for old in sorted(out.parent.glob(f".{out.name}.old-*")):
        if not old.is_dir():
            continue
        if not out.exists():
            log.warning("restoring %s from %s: an --overwrite was interrupted between its two renames", out, old)
            os.rename(old, out)
        else:
            log.warning("removing %s: the previous run, already replaced by %s", old, out)
            shutil.rmtree(old, ignore_errors=True)


def save_head(run_dir: Path, task) -> str:
    """Trainable parameters to head.safetensors; returns the file's sha256."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in task.named_parameters()}
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".head.", suffix=".tmp")
    os.close(fd)
    try:
        from safetensors.torch import save_file

        save_file(tensors, tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, Path(run_dir) / HEAD)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sha256(Path(run_dir) / HEAD)


def resolved_data(cfg) -> dict:
    """Where the data was found, as absolute paths: data_dir (after ADALAYERS_DATA) and the task's own files."""
    out = {"data_dir": str(cfg.data_dir().resolve())}
    for key in ("train", "validation", "test"):
        value = getattr(cfg.task.files, key, None)
        if isinstance(value, str) and value and Path(value).expanduser().exists():
            out[key] = str(Path(value).expanduser().resolve())
    return out


def save_config(run_dir: Path, cfg, labels: list[str], backbone, head_sha256: str | None = None, **extra) -> None:
    write_config(run_dir, {
        "config": cfg.to_dict(), "data": resolved_data(cfg), "labels": labels,
        "base": {"name": backbone.name, "fingerprint": backbone.fingerprint(),
                 "num_layers": backbone.num_layers, "hidden_size": backbone.hidden_size,
                 "adds_bos": bool(getattr(backbone, "adds_bos", False))},
        "checksums": {HEAD: head_sha256} if head_sha256 else {}, **extra})


def config_digest(meta: dict) -> str:
    """sha256 of everything in a run's config.json that can change an answer: every key except `checksums`
    and `data` (where training found its files), as canonical JSON (sorted keys, no spaces, ASCII)."""
    content = {k: v for k, v in meta.items() if k not in ("checksums", "data")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_config(run_dir: Path, meta: dict) -> None:
    """Write a run's config.json with the checksum of its own content (config_digest)."""
    meta = {**meta, "checksums": {**meta.get("checksums", {}), CONFIG: config_digest(meta)}}
    write_json(Path(run_dir) / CONFIG, meta)


def _check_digest(path: Path, meta: dict) -> None:
    recorded = meta["checksums"].get(CONFIG)
    if recorded is None:  # written before config.json covered itself (or the entry was deleted): refused
        trust.unverified(path, f'its checksums have no "{CONFIG}" entry (its labels and settings)')
    elif recorded != config_digest(meta):
        raise RunError(f"{path}: its content does not match its checksum (labels, template or head/mixer settings "
                       f"were edited); restore the file as training wrote it, or train the run again")


def read_log(run_dir: Path) -> list[dict]:
    """The epoch log (log.jsonl) of a run folder, one dict per line; [] when there is none."""
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        return []
    entries = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise RunError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return entries


def read_config(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not run_dir.is_dir():
        raise RunError(f"run folder not found: {run_dir}")
    if not path.is_file():
        raise RunError(f"{run_dir}: no config.json (is this a run folder from 'adalayers train'?)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: not a valid run config ({e})") from None
    except RecursionError:
        raise RunError(f"{path}: not a valid run config (nested too deeply to read)") from None
    if not isinstance(meta, dict):
        raise RunError(f"{path}: not a valid run config (a JSON object is expected, got {type(meta).__name__})")
    if too_deep(meta, MAX_CONFIG_DEPTH):
        raise RunError(f"{path}: not a valid run config (nested more than {MAX_CONFIG_DEPTH} levels deep)")
    try:
        RunMeta.model_validate(meta)
    except ValidationError as e:
        raise RunError(f"{path}: not a valid run config: {config_mod.one_line(e)}") from None
    _check_digest(path, meta)
    trust.check_signature(run_dir, meta["checksums"])  # with a signing key set (store/trust.py)
    return meta


def run_config(run_dir: Path, meta: dict | None = None):
    """The validated Config a run folder was trained with (no weights are read)."""
    meta = meta or read_config(run_dir)
    try:
        cfg = config_mod.from_dict(meta["config"])
    except ConfigError as e:  # one line: "invalid config: a; b"
        one = str(e).replace(":\n  - ", ": ", 1).replace("\n  - ", "; ")
        raise RunError(f"{Path(run_dir) / 'config.json'}: {one}") from None
    for key, value in (meta.get("data") or {}).items():  # where training found the data: from any folder
        if isinstance(value, str) and key in ("data_dir", "train", "validation", "test"):
            setattr(cfg.task if key == "data_dir" else cfg.task.files, key, value)
    return cfg


def check_base(run_dir: Path, meta: dict, base) -> None:
    """Refuse (ModelError, one line) a run folder trained on another base than `base` (its fingerprint())."""
    trained = meta["base"]
    if base.fingerprint() != trained["fingerprint"]:
        raise ModelError(f"{run_dir} was trained on base {trained['name']!r} (fingerprint {trained['fingerprint']}), "
                         f"but the loaded base is {base.name!r} (fingerprint {base.fingerprint()})")


def head_file(run_dir: Path, meta: dict) -> Path:
    """The run folder's head.safetensors, checked against config.json's checksum (RunError, one line)."""
    head_path = Path(run_dir) / HEAD
    if not head_path.is_file():
        raise RunError(f"{run_dir}: {HEAD} is missing (training never saved a checkpoint?)")
    if sha256(head_path) != meta["checksums"][HEAD]:
        raise RunError(f"{head_path}: checksum does not match config.json (the file was changed or damaged)")
    return head_path


def load_head(run_dir: Path, backbone=None, task=None):
    """Rebuild a trained SideTask from its run folder (checked against the base when one is given).

    `task`: a task built by the caller (e.g. one that also holds upstream heads) to load the weights into.
    """
    from adalayers.model.sidetask import SideTask

    run_dir = Path(run_dir)
    meta = read_config(run_dir)
    cfg = run_config(run_dir, meta)
    base = meta["base"]
    if backbone is not None:
        check_base(run_dir, meta, backbone)
    if meta.get("ensemble"):  # a seed ensemble: its members' run folders, relative to this one
        from adalayers.model.ensemble import EnsembleTask

        members = [load_head(run_dir / m, backbone)[0] for m in meta["ensemble"]]
        task = EnsembleTask(members)
        task.eval()
        return task, cfg, meta
    from safetensors import SafetensorError
    from safetensors.torch import load
    import torch

    head_path = head_file(run_dir, meta)
    try:  # bytes read here: safetensors' own file reader cannot open a path that is not valid UTF-8
        state = load(head_path.read_bytes())
    except (SafetensorError, OSError) as e:
        raise RunError(f"{head_path}: not a readable safetensors file ({e})") from None
    broken = [name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if broken:
        raise RunError(f"{head_path}: weights that are not finite (NaN or infinity) in {', '.join(broken[:3])}")
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

