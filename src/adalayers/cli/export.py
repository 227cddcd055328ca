"""`adalayers export`: one ONNX graph of a base and every given head (see docs/export.md)."""
from __future__ import annotations

import json
from pathlib import Path

from adalayers.export.int8 import DEFAULT_INT8, INT8_SCHEMES


def cmd_export(args) -> int:
    from adalayers.store import run as runlib
    from adalayers.model.backbone import Backbone
    from adalayers.export.onnx import export
    from adalayers.store.head_spec import parse_heads

    heads = parse_heads(args.heads, "--heads")
    for h in heads:
        runlib.read_config(h.path)  # a missing run folder fails before the base loads
    meta = export(Backbone.load(args.base), heads, Path(args.out), primary=not args.no_primary,
                  int8=args.int8 or args.int8_scheme is not None, int8_scheme=args.int8_scheme or DEFAULT_INT8)
    print(json.dumps({"out": args.out, "files": meta["files"], "inputs": meta["inputs"],
                      "outputs": [o["name"] for o in meta["outputs"]],
                      "layers_in_graph": meta["layers_in_graph"], "projected_layers": meta["projected_layers"]},
                     indent=2))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("export", help="write one ONNX graph of the base and every head (ONNX Runtime serving)")
    p.add_argument("--base", default="minilm-l6", help="the frozen base the heads were trained on")
    p.add_argument("--heads", nargs="+", required=True, metavar="RUN",
                   help="run folders (or NAME=RUN_FOLDER); each head's outputs are named NAME_logits")
    p.add_argument("--out", required=True, help="folder to write (model.onnx, tokenizer files, export.json)")
    p.add_argument("--int8", action="store_true",
                   help="also write model.int8.onnx (ONNX Runtime dynamic quantization of the weights)")
    p.add_argument("--int8-scheme", choices=list(INT8_SCHEMES), default=None,
                   help=f"which nodes --int8 quantizes, and how (default {DEFAULT_INT8}; docs/export.md "
                        "compares them); implies --int8")
    p.add_argument("--no-primary", action="store_true",
                   help="no sentence_embedding output: the base is cut after the deepest layer a head uses")
    p.set_defaults(fn=cmd_export)
