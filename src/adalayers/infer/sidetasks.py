"""Many side tasks from one pass of the base: SideTasks, the Predictor with its loaders.

    tasks = SideTasks.load("minilm-l6", ["runs/cola", "runs/imdb", "runs/conll"])
    tasks.predict(["John lives in Paris ."])
    # [{"text": ..., "base": {"embedding": [...]}, "tasks": {"cola": {"label", "probabilities"},
    #   "conll": {"words", "tags", "scores", "entities"}, ...}}]
    tasks.generate(["Write one sentence about cats."])      # a decoder LLM base: adalayers.infer.generate

What a pass does and what each answer holds: adalayers.infer.predictor and adalayers.infer.outputs. Which
engine runs the base (backend=): RUNTIMES below, each a Runtime (adalayers.infer.runtime).
"""
from __future__ import annotations

from pathlib import Path

import torch

from adalayers.data.encoding import collate
from adalayers.engine.predict import in_order
from adalayers.errors import DataError, ModelError
from adalayers.infer.heads import Head, heads_base, heads_states, load_heads, parse_head_arg
from adalayers.infer.predictor import Predictor
from adalayers.infer.runtime import Runtime
from adalayers.textcheck import check_texts

__all__ = ["SideTasks", "Head", "RUNTIMES", "heads_base", "parse_head_arg"]

RUNTIMES = ("torch", "onnx", "onnx-int8", "llama.cpp")
POOLINGS = ("mean", "last")  # SideTasks.embed's (llama-server's --pooling mean / last)


class SideTasks(Predictor):
    """A Predictor over one base and its heads (see adalayers.infer.predictor for predict, count_tokens, ...)."""

    @classmethod
    def load(cls, base: str | None, run_dirs: list, primary: bool = True, device: str = "auto",
             backend: str = "torch", threads: int | None = None, ctx_size: int | None = None,
             parallel: int | None = None, **kw) -> "SideTasks":
        """One base (alias, folder or hub id) and the heads in `run_dirs` ('RUN' or 'NAME=RUN'); no heads at
        all is a base alone (its generation, its embeddings), and then `base` must be named.

        base=None: the base every head was trained on (heads_base). backend="onnx" (or "onnx-int8"): one
        exported graph run by ONNX Runtime (adalayers.infer.onnx); `base` may then also be a folder
        written by `adalayers export`. backend="llama.cpp": a GGUF base (alias or .gguf file) run quantized
        by llama.cpp, the heads fed through its eval callback (adalayers.infer.llamacpp_backbone).
        `threads`: the CPU threads of the ONNX Runtime and llama.cpp engines. llama.cpp's context (context_size):
        `ctx_size` KV tokens and `parallel` sequences for generations, beside the same again for passes.
        """
        base = base or heads_base(run_dirs)
        if backend == "torch":
            from adalayers.core import pick_device
            from adalayers.model.backbone import Backbone

            return cls.from_backbone(Backbone.load(base, heads_states(run_dirs), pick_device(device)), run_dirs,
                                     primary, **kw)
        if backend == "llama.cpp":
            from adalayers.infer.llamacpp_backbone import LlamaCppBackbone

            sizes = context_size(ctx_size, parallel) if ctx_size or parallel else {}
            return cls.from_backbone(LlamaCppBackbone.load(base, threads=threads, **sizes), run_dirs, primary, **kw)
        if backend in ("onnx", "onnx-int8"):
            from adalayers.infer import onnx

            runtime, heads = onnx.load(base, run_dirs, primary=primary, backend=backend, threads=threads)
            return cls(runtime, heads, primary and runtime.has_own_output, **kw)
        raise ModelError(f"backend {backend!r}: choose one of {', '.join(RUNTIMES)}")

    @classmethod
    def from_backbone(cls, backbone, run_dirs: list, primary: bool = True, **kw) -> "SideTasks":
        """The heads in `run_dirs` on a loaded base: a transformers Backbone or any Runtime."""
        return cls(backbone, load_heads(backbone if not isinstance(backbone, Runtime) else backbone.base, run_dirs),
                   primary, **kw)

    @classmethod
    def open_export(cls, folder: Path, names: list[str] | None = None, primary: bool = True, int8: bool = False,
                    threads: int | None = None, graph: str | None = None, **kw) -> "SideTasks":
        """A folder written by `adalayers export`, run by ONNX Runtime: its heads (or those named), its
        fp32 graph (int8: its int8 copy; `graph`: another .onnx file of the folder)."""
        from adalayers.infer import onnx

        runtime, heads = onnx.open_folder(folder, names, int8=int8, threads=threads, graph=graph)
        return cls(runtime, heads, primary and runtime.has_own_output, **kw)

    def embed(self, texts: list[str], pooling: str = "mean") -> list[list[float]]:
        """A decoder base's embedding of each text, as llama-server's /v1/embeddings gives it: the last state
        (the final norm's output) over the text's tokens (BOS included, truncated to max_length), pooled by
        `pooling` ("mean" of every token, or the "last" token's), L2-normalized. One pass per batch of rows,
        the LM head skipped."""
        if pooling not in POOLINGS:
            raise DataError(f"pooling {pooling!r}: choose one of {', '.join(POOLINGS)}")
        check_texts(texts)
        ids = self._tokenize(texts, truncation=True, max_length=self.max_length)["input_ids"]
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


def context_size(ctx_size: int | None, parallel: int | None) -> dict:
    """llama.cpp's {n_ctx, n_seq} for generations of `ctx_size` KV tokens and `parallel` sequences in all (the
    meaning of llama-server's --ctx-size and --parallel): the context is split in two equal shares, one for
    /predict's passes and one for generations (LlamaCppBackbone.generation_room), so it holds twice as much.
    None: 2048 tokens, 16 sequences (LlamaCppBackbone.load's own default context)."""
    return {"n_ctx": 2 * (ctx_size or 2048), "n_seq": 2 * (parallel or 16)}
