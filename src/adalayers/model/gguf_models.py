"""GGUF files (llama.cpp / Ollama) as frozen bases: converted once to a Hugging Face folder.

    folder = converted(Path("gemma-3-270m-q4_k_m.gguf"))   # $ADALAYERS_CACHE/models/gguf-<sha256[:16]>/

transformers reads a GGUF file and dequantizes it to fp32 (about a minute for 270M parameters on
two cores). The result is saved once as safetensors + tokenizer, keyed by the file's sha256, so
every later load takes seconds and a changed file never reuses a stale conversion. The loaded
model still carries the GGUF "quantizer" although its weights are plain fp32; transformers then
refuses save_pretrained, so the quantizer and its quantization_config are dropped first (the
reload matches bit for bit). The folder appears by one rename: a crash leaves no half model.

    tok = tokenizer(Path("gemma-3-270m-q4_k_m.gguf"))      # the file's transformers tokenizer, built once

A runtime that runs the GGUF itself (llama.cpp) needs only the tokenizer: transformers builds it from the
file's vocabulary (for Gemma 3's 262,144 tokens most of a server's start-up time and memory), so it is kept
too, as a tokenizer folder keyed by the same sha256 (the conversion's own when there is one), read back fast.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from adalayers.errors import ModelError
from adalayers.files import cache_root, sha256 as file_sha256

log = logging.getLogger(__name__)
MAGIC = b"GGUF"


def check_header(path: Path) -> None:
    """A GGUF file starts with the 4 bytes 'GGUF' and a little-endian version number (2 or 3)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}") from None
    if len(head) < 8 or head[:4] != MAGIC:
        raise ModelError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise ModelError(f"{path}: GGUF version {version} is not supported (2 or 3)")


def conversion_folder(path: Path, sha256: str | None = None) -> Path:
    """Where `path`'s conversion is (or will be) kept, $ADALAYERS_CACHE/models/gguf-<sha256[:16]>: nothing made."""
    return cache_root() / "models" / f"gguf-{(sha256 or file_sha256(Path(path).expanduser()))[:16]}"


def kept_fingerprint(path: Path, sha256: str | None = None) -> str | None:
    """The base fingerprint kept beside `path`'s conversion (model.backbone.gguf_fingerprint), or None: never
    computed. Reads one small file (no conversion, no torch: the torch-free serving path asks it)."""
    kept = conversion_folder(path, sha256) / "fingerprint"
    return kept.read_text(encoding="utf-8").strip() if kept.is_file() else None


def converted(path: Path, sha256: str | None = None) -> Path:
    """The Hugging Face folder holding `path`'s weights (fp32 safetensors) and tokenizer; made once."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ModelError(f"GGUF file not found: {path}")
    check_header(path)
    digest = sha256 or file_sha256(path)
    target = conversion_folder(path, digest)
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("converting %s to safetensors in %s (once; about a minute per 300M parameters)", path.name, target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".gguf-") as tmp:
        _convert(path, Path(tmp) / "model")
        _put_in_place(Path(tmp) / "model", target, path, digest)
    return target


def _put_in_place(out: Path, target: Path, path: Path, digest: str) -> None:
    """A finished folder marked complete (with the file it came from) and renamed to `target` in one step."""
    (out / "source.txt").write_text(f"{path.name}\nsha256 {digest}\n", encoding="utf-8")
    (out / ".complete").touch()
    if target.exists():
        shutil.rmtree(target)
    os.replace(out, target)


def tokenizer(path: Path, sha256: str | None = None):
    """`path`'s transformers tokenizer as AutoTokenizer.from_pretrained(gguf_file=...) builds it, read from a folder
    written the first time (save_pretrained, renamed into place). The folder is read back as its tokenizer.json
    holds it (PreTrainedTokenizerFast), not through the model's tokenizer class, which would add its own defaults
    (Qwen2's class adds an NFC normalizer the GGUF's vocabulary does not have, and llama.cpp does not apply); a
    folder that would not read back the same pipeline, special tokens and chat template is not kept. The first
    load returns the folder's tokenizer too, as every later load does: the built one is of the model's tokenizer
    class (e.g. Qwen2TokenizerFast), whose name is part of the hidden-states cache's key."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ModelError(f"GGUF file not found: {path}")
    check_header(path)
    digest = sha256 or file_sha256(path)
    models = cache_root() / "models"
    for folder in (models / f"gguf-{digest[:16]}", models / f"gguf-{digest[:16]}-tokenizer"):  # the last: ours
        if (folder / ".complete").is_file():
            return _read_tokenizer(folder, path)
    from transformers import AutoTokenizer

    log.info("reading the vocabulary of %s into a tokenizer (once; kept in %s)", path.name, folder)
    try:
        built = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"cannot read the tokenizer of {path}: {str(e).splitlines()[0]}") from None
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".tokenizer-") as tmp:
        out = Path(tmp) / "tokenizer"
        built.save_pretrained(out)
        if not same_tokenizer(built, _read_tokenizer(out, path)):
            log.warning("the tokenizer of %s does not read back the same from a folder; it is built at every load",
                        path.name)
            return built
        _put_in_place(out, folder, path, digest)
    return _read_tokenizer(folder, path)  # what every later load returns: the same class, so the same cache keys


def same_tokenizer(a, b) -> bool:
    """The same tokenization pipeline (normalizer, pre-tokenizer, model, post-processor, decoder, added tokens),
    special tokens and chat template."""
    return (a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
            and a.special_tokens_map == b.special_tokens_map and a.chat_template == b.chat_template)


def _read_tokenizer(folder: Path, path: Path):
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"cannot read the tokenizer of {path} kept in {folder}: {str(e).splitlines()[0]}") from None


def _convert(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        with _own_bar():
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except ImportError as e:
        raise ModelError(f"reading GGUF files needs the gguf package: pip install 'adalayers[llm]' ({e})") from None
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ModelError(f"transformers cannot read {path}: {str(e).splitlines()[0]}") from None
    model.hf_quantizer = None  # weights are dequantized fp32 already; see the module docstring
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextmanager
def _own_bar():
    """transformers draws its own tqdm bar over the GGUF tensors ("Converting and de-quantizing GGUF
    tensors...", left behind half drawn in a log) and no switch of its turns it off; while converting, its
    module's tqdm is adalayers' bar (adalayers.engine.progress.bar: cleared when done, plain lines in a log)."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    from adalayers.engine.progress import bar  # here: the engine package imports torch, a GGUF header needs none

    gguf_utils.tqdm = lambda items, *args, **kw: bar(items, len(items) if hasattr(items, "__len__") else None,
                                                     "converting the GGUF tensors (once)")
    try:
        yield
    finally:
        gguf_utils.tqdm = original
