"""The chat template a base's conversations are rendered with, when its tokenizer has none: the one in a GGUF
file's own metadata (tokenizer.chat_template, what llama-server uses), read without building its vocabulary.
In model/ beside model_packages.py, whose packaged GGUF aliases it resolves."""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

from adalayers.errors import ModelError
from adalayers.model import model_packages


def gguf_chat_template(base: str) -> str | None:
    """The Jinja chat template in a GGUF base's own metadata (tokenizer.chat_template, what llama-server uses),
    or None: the base is no GGUF file (an alias of one, or a .gguf path), or its file has none (a pretrained
    base model, e.g. gemma3-270m). Both runtimes' tokenizers usually carry it already (transformers reads it
    from the file); this reads it when a tokenizer does not."""
    if base in model_packages.SPLIT_GGUF:
        path = model_packages.joined_gguf(base)
    elif base.lower().endswith(".gguf"):
        path = Path(base).expanduser()
    else:
        return None
    try:
        return _gguf_string(path, "tokenizer.chat_template")
    except (OSError, ValueError, struct.error) as e:
        raise ModelError(f"cannot read the metadata of {path}: {e}") from None


# GGUF metadata value types (gguf's GGUFValueType): fixed sizes in bytes; 8 is a string, 9 an array
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _gguf_string(path: Path, key: str) -> str | None:
    """The string value of `key` in a GGUF file's metadata (None: no such key), read by walking the key-value
    pairs and skipping the others (gguf.GGUFReader would build every one of a vocabulary's 262k tokens)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError("not a GGUF file")
        (n_kv,), at = struct.unpack_from("<Q", m, 16), 24

        def skip(kind: int, at: int) -> int:
            if kind == 8:
                return at + 8 + struct.unpack_from("<Q", m, at)[0]
            if kind == 9:
                inner, count = struct.unpack_from("<IQ", m, at)
                at += 12
                if inner != 8:
                    return at + count * _GGUF_SIZES[inner]
                for _ in range(count):
                    at = skip(8, at)
                return at
            return at + _GGUF_SIZES[kind]

        for _ in range(n_kv):
            (length,) = struct.unpack_from("<Q", m, at)
            name, at = m[at + 8: at + 8 + length].decode("utf-8"), at + 8 + length
            (kind,), at = struct.unpack_from("<I", m, at), at + 4
            if name == key and kind == 8:
                (size,) = struct.unpack_from("<Q", m, at)
                return m[at + 8: at + 8 + size].decode("utf-8")
            at = skip(kind, at)
    return None


def base_chat_template(tokenizer, base: str, given: str | None = None) -> str | None:
    """The chat template a chat completion is rendered with: `given` (--chat-template), else None when the
    tokenizer has its own, else the GGUF file's (gguf_chat_template); a ModelError, one line, when the base
    has none at all (a pretrained base model: it continues text, it does not answer a conversation)."""
    if given or getattr(tokenizer, "chat_template", None):
        return given
    found = gguf_chat_template(base)
    if found:
        return found
    raise ModelError(f"{Path(base).name} is a pretrained base model without a chat template: use /v1/completions, "
                     "or give the server --chat-template FILE")
