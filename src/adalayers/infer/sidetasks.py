"""Many side tasks from one pass of the base: SideTasks, the Predictor with its loaders.

    tasks = SideTasks.load("minilm-l6", ["runs/cola", "runs/imdb", "runs/conll"])
    tasks.predict(["John lives in Paris ."])
    # [{"text": ..., "base": {"embedding": [...]}, "tasks": {"cola": {"label", "probabilities"},
    #   "conll": {"words", "tags", "scores", "entities"}, ...}}]
    tasks.generate(["Write one sentence about cats."])      # a decoder LLM base: adalayers.infer.generate

What a pass does and what each answer holds: adalayers.infer.predictor and adalayers.infer.outputs. Which
engine runs the base (runtime=): a name of the registry adalayers.runtimes, its loader in adalayers.infer.loaders,
each a Runtime (adalayers.infer.runtime). Heads may be given as str, Path or HeadSpec (adalayers.store.head_spec),
parsed here once.
"""
from __future__ import annotations

from pathlib import Path

import torch

from adalayers.data.encoding import collate
from adalayers.engine.predict import in_order
from adalayers import runtimes
from adalayers.infer.heads import Head, heads_base, load_heads
from adalayers.infer.llamacpp import context_size
from adalayers.infer.loaders import LoadRequest
from adalayers.infer.predictor import Predictor
from adalayers.infer.runtime import Runtime
from adalayers.store.head_spec import HeadSpec, parse_heads
from adalayers.store.trust import trusting

__all__ = ["SideTasks", "Head", "HeadSpec", "heads_base", "parse_heads"]



class SideTasks(Predictor):
    """A Predictor over one base and its heads (see adalayers.infer.predictor for predict, count_tokens, ...)."""

    @classmethod
    def load(cls, base: str | None, heads: list, primary: bool = True, device: str = "auto",
             runtime: str = "torch", threads: int | None = None, ctx_size: int | None = None,
             parallel: int | None = None, trust_unverified: bool = False, backend: str | None = None,
             **kw) -> "SideTasks":
        """One base (alias, folder or hub id) and its `heads` (each 'RUN', 'NAME=RUN' or a HeadSpec); no heads
        at all is a base alone (its generation, its embeddings), and then `base` must be named.

        base=None: the base every head was trained on (heads_base). runtime="onnx" (or "onnx-int8"): one
        exported graph run by ONNX Runtime (adalayers.infer.onnx); `base` may then also be a folder
        written by `adalayers export`. runtime="llama.cpp": a GGUF base (alias or .gguf file) run quantized
        by llama.cpp, the heads fed through its eval callback (adalayers.infer.llamacpp_backbone). Every runtime:
        adalayers.runtimes.names(); `backend` is runtime's deprecated old name.
        `threads`: the CPU threads of the ONNX Runtime and llama.cpp engines. llama.cpp's context (context_size):
        `ctx_size` KV tokens and `parallel` sequences for generations, beside the same again for passes.
        `trust_unverified`: load run folders and exports that lack a checksum entry (older ones), with a
        warning (store/trust.py).
        """
        runtime = runtimes.deprecated_backend(runtime, backend)
        entry = runtimes.get(runtime)  # an unknown runtime fails before any head is read
        specs = tuple(parse_heads(heads))
        sizes = context_size(ctx_size, parallel) if ctx_size or parallel else {}
        with trusting(trust_unverified):
            loaded = entry.load(LoadRequest(base or heads_base(list(specs)), specs, primary, device,
                                            threads=threads, **sizes))
        return cls(loaded.runtime, loaded.heads, primary and loaded.runtime.has_own_output, **kw)

    @classmethod
    def from_backbone(cls, backbone, heads: list, primary: bool = True, trust_unverified: bool = False,
                      **kw) -> "SideTasks":
        """The `heads` ('RUN', 'NAME=RUN' or a HeadSpec each) on a loaded base: a transformers Backbone or any
        Runtime."""
        specs = parse_heads(heads)
        with trusting(trust_unverified):
            return cls(backbone, load_heads(backbone if not isinstance(backbone, Runtime) else backbone.base,
                                            specs), primary, **kw)

    @classmethod
    def open_export(cls, folder: Path, names: list[str] | None = None, primary: bool = True, int8: bool = False,
                    threads: int | None = None, graph: str | None = None, trust_unverified: bool = False,
                    **kw) -> "SideTasks":
        """A folder written by `adalayers export`, run by ONNX Runtime: its heads (or those named), its
        fp32 graph (int8: its int8 copy; `graph`: another .onnx file of the folder)."""
        from adalayers.infer import onnx

        with trusting(trust_unverified):
            runtime, heads = onnx.open_folder(folder, names, int8=int8, threads=threads, graph=graph)
        return cls(runtime, heads, primary and runtime.has_own_output, **kw)

    def embed(self, texts: list[str], pooling: str = "mean") -> list[list[float]]:
        """A decoder base's embedding of each text, as llama-server's /v1/embeddings gives it: the last state
        (the final norm's output) over the text's tokens (BOS included, truncated to max_length), pooled by
        `pooling` ("mean" of every token, or the "last" token's), L2-normalized. One pass per batch of rows,
        the LM head skipped."""
        ids = self._embedding_ids(texts, pooling)
        left, last = self.backbone.is_causal, self.backbone.num_layers - 1
        pad = self.backbone.tokenizer.pad_token_id or 0
        out: list[list[float]] = []
        with self._lock, torch.inference_mode():
            for idx in in_order(len(ids), self.batch_size):
                batch = collate([{"input_ids": ids[i]} for i in idx], idx, pad, left=left)
                states: dict[int, torch.Tensor] = {}
                self.runtime.base(batch, taps=[lambda i, z: states.__setitem__(i, z)], stop_after=last)
                z, mask = states[last].float(), batch["attention_mask"].unsqueeze(-1).float()
                if pooling == "mean":
                    v = (z * mask).sum(1) / mask.sum(1).clamp(min=1)
                else:  # the last real token: the last column when padded on the left
                    v = z[:, -1] if left else z[torch.arange(len(idx)), mask.squeeze(-1).sum(1).long() - 1]
                out += torch.nn.functional.normalize(v, dim=-1).tolist()
                self.rows_run += len(idx)
        return out

    def generate(self, prompts: list[str], max_new_tokens: int = 32, tasks: list[str] | None = None,
                 **kw) -> list[dict]:
        """Generated text plus every side task on the prompt and on prompt + answer, from the generation
        pass itself (a decoder LLM base; see adalayers.infer.generate for the options)."""
        from adalayers.infer.generate import generate
        return generate(self, prompts, max_new_tokens, tasks, **kw)
