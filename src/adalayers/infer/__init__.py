"""Inference: one front door for every way users run heads (CLI predict, the service, predict-files, generation).

    sidetasks.py        SideTasks: the Predictor with its loaders (load, from_backbone, open_export)
    predictor.py        Predictor: texts or pairs -> rows -> one base pass -> every head's answer
    outputs.py          the one output schema (labels, values, word tags and entities)
    heads.py            Head: one trained run folder, loaded from a HeadSpec (adalayers.store.head_spec)
    runtime.py          Runtime: the base pass behind one small interface (+ Decoder and Cache for generation)
    loaders.py          the built-in runtimes' loaders, registered by name in adalayers.runtimes
    torch_runtime.py    transformers in PyTorch (the default)      onnx.py   ONNX Runtime (an exported graph)
    llamacpp_backbone.py  llama.cpp (a GGUF base, its eval callback; engine in llamacpp.py)
    generate.py         the one generation loop (Generation: prefill, step), stream() and generate()
    batching.py         rows of several generations in one batch (merge, step, leave)
"""
