"""What a run folder or an export must prove before it is loaded: checksums always, a signature on request.

Checksums. A run's config.json records the sha256 of head.safetensors and of its own content; an export's
export.json the sha256 of its graph and tokenizer files. A missing entry is a refusal (ModelError naming the
file), never a warning: deleting the entry was enough to load an edited file (issue 56). Runs written before
the entries existed load only with an explicit escape: `--trust-unverified` on the commands that load runs
(predict, predict-files, serve, export, evaluate, push), trust_unverified=True in Python (SideTasks.load,
from_backbone, open_export), or ADALAYERS_TRUST_UNVERIFIED=1 (what the flag sets, so that Ray workers
started by the command inherit it). Each file loaded that way is logged.

Signatures. A plain sha256 can be recomputed by whoever edits the file. A team that needs more signs its
folders with a secret key: HMAC-SHA256 over the checksum manifest (the `checksums` object of config.json or
export.json, as canonical JSON), written to SIGNATURE beside it by `adalayers sign FOLDER...`. With a key
configured (ADALAYERS_SIGNING_KEY, or ADALAYERS_SIGNING_KEY_FILE naming a file that holds it), every folder
loaded must carry a valid signature; without a key, signatures are not checked. The manifest covers every
file the load reads (each by its sha256), so a signed folder cannot be edited and re-hashed without the key.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import hmac
import json
import logging
import os
from pathlib import Path

from adalayers.errors import ConfigError, ModelError

TRUST_ENV = "ADALAYERS_TRUST_UNVERIFIED"
KEY_ENV, KEY_FILE_ENV = "ADALAYERS_SIGNING_KEY", "ADALAYERS_SIGNING_KEY_FILE"
SIGNATURE = "signature.json"
MIN_KEY_CHARS = 16
log = logging.getLogger(__name__)
_trusted = contextvars.ContextVar("trust_unverified", default=False)
_signing = contextvars.ContextVar("signing", default=False)


@contextlib.contextmanager
def trusting(trust_unverified: bool = True):
    """Within it, a missing checksum entry is logged instead of refused (trust_unverified=True in Python)."""
    token = _trusted.set(bool(trust_unverified) or _trusted.get())
    try:
        yield
    finally:
        _trusted.reset(token)


def trust_process() -> None:
    """--trust-unverified: for this process and the ones it starts (Ray's workers), through TRUST_ENV."""
    os.environ[TRUST_ENV] = "1"


def trusted() -> bool:
    return _trusted.get() or os.environ.get(TRUST_ENV) == "1"


def unverified(path: Path, what: str) -> None:
    """A file loaded without a checksum: refused (ModelError naming it), unless unverified loads are trusted."""
    if not trusted():
        raise ModelError(f"{path}: {what}, so it cannot be checked; train or export it again, or load it anyway "
                         f"with --trust-unverified (trust_unverified=True in Python) if you trust where it came from")
    log.warning("%s: %s; loaded unchecked (--trust-unverified)", path, what)


def signing_key() -> bytes | None:
    """The configured signing key (ADALAYERS_SIGNING_KEY, else the file ADALAYERS_SIGNING_KEY_FILE names), or None."""
    key = os.environ.get(KEY_ENV)
    if key is None and os.environ.get(KEY_FILE_ENV):
        try:
            key = Path(os.environ[KEY_FILE_ENV]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"${KEY_FILE_ENV}: cannot read {os.environ[KEY_FILE_ENV]} ({e})") from None
    if key is None:
        return None
    key = key.strip()
    if len(key) < MIN_KEY_CHARS:
        raise ConfigError(f"the signing key has {len(key)} characters; use at least {MIN_KEY_CHARS} "
                          f"(python -c \"import secrets; print(secrets.token_urlsafe(32))\")")
    return key.encode()


def manifest_signature(checksums: dict, key: bytes) -> str:
    """HMAC-SHA256 of the checksum manifest (canonical JSON: sorted keys, no spaces), hex."""
    return hmac.new(key, json.dumps(checksums, sort_keys=True, separators=(",", ":")).encode(),
                    hashlib.sha256).hexdigest()


def sign(folder: Path, checksums: dict, key: bytes) -> Path:
    """Write `folder`/SIGNATURE: the manifest's HMAC (see the module's docstring)."""
    path = Path(folder) / SIGNATURE
    path.write_text(json.dumps({"algorithm": "hmac-sha256", "signature": manifest_signature(checksums, key)})
                    + "\n", encoding="utf-8")
    return path


@contextlib.contextmanager
def signing():
    """Within it (`adalayers sign` verifying the folders it signs), signatures are not checked."""
    token = _signing.set(True)
    try:
        yield
    finally:
        _signing.reset(token)


def check_signature(folder: Path, checksums: dict) -> None:
    """With a key configured, refuse a folder whose SIGNATURE is missing or does not match its manifest."""
    key = None if _signing.get() else signing_key()
    if key is None:
        return
    path = Path(folder) / SIGNATURE
    try:
        given = json.loads(path.read_text(encoding="utf-8")).get("signature")
    except FileNotFoundError:
        raise ModelError(f"{path}: missing, and a signing key is set (${KEY_ENV} / ${KEY_FILE_ENV}): sign the "
                         f"folder with `adalayers sign {folder}`, or unset the key") from None
    except (OSError, ValueError, AttributeError) as e:
        raise ModelError(f"{path}: not a readable signature ({e})") from None
    if not isinstance(given, str) or not hmac.compare_digest(given, manifest_signature(checksums, key)):
        raise ModelError(f"{path}: the signature does not match the folder's checksums (the folder was changed "
                         f"after it was signed, or it was signed with another key)")
