"""One ONNX graph of a frozen base and every head: `adalayers export` and the ONNX Runtime backend.

    graph.py     the PyTorch module that is exported (base + one GEMM per layer for all heads)
    onnx.py      export to DIR/model.onnx (+ model.int8.onnx), tokenizer files, export.json
    int8.py      int8 schemes: which nodes ONNX Runtime's dynamic quantization touches, and how
    (the ONNX Runtime backend that runs it: adalayers.infer.onnx.OnnxRuntime; the command: adalayers.cli.export)
"""
