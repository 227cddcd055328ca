"""`adalayers sign FOLDER...`: sign run folders and exports with the team's key (HMAC-SHA256 over their checksum
manifest; adalayers.store.trust explains what is signed and when it is checked)."""
from __future__ import annotations

import json
from pathlib import Path

from adalayers.errors import ConfigError, RunError
from adalayers.store import trust


def sign_folder(folder: Path, key: bytes) -> list[Path]:
    """Sign a run folder (its config.json's checksums), or an export (export.json's manifest and each of its
    heads' run folders); every checksum is verified first, so an edited folder is never signed."""
    from adalayers.export import onnx
    from adalayers.store import run as runlib

    folder = Path(folder)
    if (folder / runlib.CONFIG).is_file():
        meta = runlib.read_config(folder)  # checks config.json's own checksum
        if not meta.get("ensemble"):
            runlib.load_head(folder)  # checks head.safetensors against its sha256
        written = [trust.sign(folder, meta["checksums"], key)]
        return written + [p for m in meta.get("ensemble") or [] for p in sign_folder(folder / m, key)]
    if (folder / onnx.META).is_file():
        meta = onnx.read_meta(folder)
        if not isinstance(meta.get("checksums"), dict):
            raise RunError(f"{folder / onnx.META}: no checksums to sign; export the folder again")
        for graph in [g for g in (onnx.MODEL, onnx.MODEL_INT8) if g in meta["checksums"]] or [onnx.MODEL]:
            onnx.verify(folder, meta, graph)
        written = [trust.sign(folder, onnx.signed_manifest(meta), key)]
        return written + [p for head in sorted((folder / "heads").glob("*/")) for p in sign_folder(head, key)]
    raise RunError(f"{folder}: neither a run folder (config.json) nor an export (export.json)")


def cmd_sign(args) -> int:
    key = trust.signing_key()
    if key is None:
        raise ConfigError(f"no signing key: set ${trust.KEY_ENV}, or ${trust.KEY_FILE_ENV} to a file that holds it")
    for folder in args.folders:
        with trust.signing():  # the checksums are verified, the signature about to be written is not
            written = sign_folder(Path(folder), key)
        for path in written:
            print(json.dumps({"signed": str(path)}))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("sign", help="sign run folders or exports with the key in $ADALAYERS_SIGNING_KEY "
                                    "(or the file $ADALAYERS_SIGNING_KEY_FILE names); checked at load")
    p.add_argument("folders", nargs="+", metavar="FOLDER", help="run folders or export folders")
    p.set_defaults(fn=cmd_sign)
