"""int8 copies of an exported graph: ONNX Runtime's quantization tools on selected MatMul nodes.

Two methods, both with activations quantized at run time (no calibration data):

    dynamic    onnxruntime.quantization.quantize_dynamic: weights int8 (per output channel or per
               matrix); each input of a quantized MatMul becomes uint8 with ONE scale per tensor per
               batch (DynamicQuantizeLinear), so a few large activations coarsen every other value.
    blockwise  onnxruntime.quantization MatMulNBitsQuantizer, bits=8: weights int8 with one scale per
               block of `block_size` inputs of each output; MatMulNBits with accuracy_level 4 quantizes
               the activations to int8 per block of each row at run time (fine-grained scales), with
               accuracy_level 1 it computes in fp32 from the int8 weights (weight-only).

Nodes not selected stay fp32 (the per-layer head projections, the heads, LayerNorm, softmax, GELU).
A scheme names the selection and the options; benchmarks/int8_options.py measures each against
fp32 PyTorch (prediction agreement, CoLA MCC, CoNLL F1, time, size).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from adalayers.errors import ModelError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Int8Scheme:
    """Which MatMul nodes with constant weights get int8 weights, and how.

    A node is selected when its name matches `include` and not `exclude` (regular expressions over
    the exported node names, e.g. /model/encoder/layer.3/output/dense/MatMul).
    """
    include: str = r"^/model/"
    exclude: str | None = None
    method: str = "dynamic"     # or "blockwise"
    per_channel: bool = True    # dynamic: one weight scale per output channel (else per matrix)
    reduce_range: bool = False  # dynamic: 7-bit weights
    weight_type: str = "QInt8"  # dynamic: or "QUInt8"
    block_size: int = 128       # blockwise: inputs per weight scale
    accuracy_level: int = 4     # blockwise: 4 = int8 compute (activations quantized per block), 1 = fp32 compute
    about: str = ""


# The schemes benchmarks/int8_options.py measures; `adalayers export --int8` writes DEFAULT_INT8,
# the fastest that kept >= 97% of fp32's predictions on both CoLA and CoNLL (docs/export.md).
INT8_SCHEMES: dict[str, Int8Scheme] = {
    "base": Int8Scheme(about="dynamic, every MatMul of the base, weights per output channel"),
    "base-per-tensor": Int8Scheme(per_channel=False, about="dynamic, every MatMul of the base, one weight scale "
                                                           "per matrix"),
    "base-reduce-range": Int8Scheme(reduce_range=True, about="as base, 7-bit weights (reduce_range)"),
    "base-uint8": Int8Scheme(weight_type="QUInt8", about="as base, asymmetric uint8 weights"),
    "no-ffn-out": Int8Scheme(exclude=r"/output/dense/", about="as base without the two output projections of each "
                             "layer (`/output/dense/`: after attention and the FFN down-projection, whose input is the "
                             "GELU output with outliers that dominate a per-tensor uint8 scale)"),
    "attention": Int8Scheme(include=r"^/model/.*/attention/", about="dynamic, only the attention projections "
                                                                    "(Q, K, V, output)"),
    "ffn-in": Int8Scheme(include=r"^/model/.*/intermediate/dense/", about="dynamic, only the FFN up-projections"),
    "no-layer0": Int8Scheme(exclude=r"/layer\.0/", about="as base without the first layer (its errors reach every "
                            "later layer the heads read)"),
    "blockwise": Int8Scheme(method="blockwise", about="MatMulNBits 8-bit, every MatMul of the base, a weight scale "
                            "per 128 inputs, int8 compute with activations quantized per block (accuracy_level 4)"),
    "blockwise-32": Int8Scheme(method="blockwise", block_size=32, about="as blockwise, blocks of 32"),
    "weight-only": Int8Scheme(method="blockwise", accuracy_level=1, about="MatMulNBits 8-bit weights, blocks of "
                              "128, computed in fp32 (accuracy_level 1)"),
}
DEFAULT_INT8 = "blockwise"


def selected(model, scheme: Int8Scheme) -> tuple[list[str], list[str]]:
    """(selected, other) names of the MatMul nodes whose weight (second input) is a constant."""
    consts = {i.name for i in model.graph.initializer}
    nodes = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in consts]
    chosen = [n for n in nodes
              if re.search(scheme.include, n) and not (scheme.exclude and re.search(scheme.exclude, n))]
    return chosen, [n for n in nodes if n not in chosen]


def quantize(src: Path, dst: Path, scheme: str = DEFAULT_INT8) -> list[str]:
    """Write the int8 copy of the graph `src` to `dst` by the named scheme; returns the quantized nodes."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if scheme not in INT8_SCHEMES:
        raise ModelError(f"int8 scheme {scheme!r}: choose one of {', '.join(INT8_SCHEMES)}")
    s = INT8_SCHEMES[scheme]
    model = onnx.load(str(src))
    nodes, others = selected(model, s)
    log.info("quantizing %s to int8 (%s, scheme %s: %d MatMul nodes)", Path(src).name, s.method, scheme, len(nodes))
    if s.method == "dynamic":
        quantize_dynamic(model, str(dst), weight_type=getattr(QuantType, s.weight_type), nodes_to_quantize=nodes,
                         per_channel=s.per_channel, reduce_range=s.reduce_range)
        return nodes
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # nodes_to_include would ADD to every MatMul; the complement excluded selects exactly `nodes`
    qlog = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = qlog.level
    qlog.setLevel(logging.WARNING)  # it logs a line per node of the graph at INFO
    try:
        q = MatMulNBitsQuantizer(model, bits=8, block_size=s.block_size, is_symmetric=True,
                                 accuracy_level=s.accuracy_level, nodes_to_exclude=others)
        q.process()
        q.model.save_model_to_file(str(dst), False)
    finally:
        qlog.setLevel(level)
    return nodes
