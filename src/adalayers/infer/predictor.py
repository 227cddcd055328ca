"""The one front door of inference (torch): texts (or sentence pairs) -> rows -> one base pass -> every head's answer.

    predictor = Predictor(runtime, heads)        # any adalayers.infer.runtime.Runtime; heads: infer.heads.Head
    predictor.predict(["John lives in Paris ."])
    # [{"text": ..., "truncated": false, "base": {"embedding": [...]}, "tasks": {"cola": {"label", "probabilities"},
    #   "conll": {"words", "tags", "scores", "entities"}, ...}}]        (the schema: adalayers.infer.outputs)

SideTasks (adalayers.infer.sidetasks) is this class with its loaders; the CLI's `predict`, the service,
predict-files (local and Ray) and generation all answer through it. Per batch the base runs once; every
head's accumulator is fed by the same layer taps. The batches go through the engine's one prediction loop
(adalayers.engine.predict), whose model here is the runtime's pass.

Tokenization (one for all heads). Sequence heads were trained on the plain text, token heads on
the whitespace-split words (is_split_into_words). Each text is tokenized once, plainly, and the
character offsets of its tokens say which word each token belongs to. For WordPiece bases
(MiniLM, MPNet, BERT) this gives exactly the ids of both training tokenizations, and the base
output never depends on which heads are loaded or asked for. A text longer than max_length is
truncated for the base output and the sequence heads (as in training); when a token head is asked
for, such a text also gets extra rows, windows cut at word boundaries (as in training), and the
token heads read those, so every word is tagged.
"""
from __future__ import annotations

from typing import Callable

import torch

from adalayers.data.encoding import collate
from adalayers.engine.predict import predict
from adalayers.errors import Cancelled, ModelError
from adalayers.infer.heads import Head, used_layers
from adalayers.infer.predictor_base import PredictorBase, _real
from adalayers.infer.runtime import Runtime
from adalayers.infer.shared_tokenizer import shared
from adalayers.infer.torch_runtime import as_runtime
from adalayers.kinds import TaskKind
from adalayers.model.sidetask import shared_tap

# generation's passes of at most this many positions (its decode steps, small prefills) run the heads' work
# for every layer at once after the pass (adalayers.model.fused.FusedTap's defer)
STEP_POSITIONS = 64


class Predictor(PredictorBase):
    """PredictorBase (rows, answers) over a torch runtime: transformers, ONNX Runtime or llama.cpp, torch heads."""

    def __init__(self, runtime: Runtime, heads: list[Head], primary: bool = True,
                 max_length: int | None = None, batch_size: int = 32):
        """`runtime`: the base pass (a transformers Backbone is taken as its TorchRuntime). `batch_size`: rows
        per pass, at most what the runtime takes per pass (runtime.rows_per_pass)."""
        runtime = as_runtime(runtime)
        runtime.base.tokenizer = shared(runtime.base.tokenizer)  # one lock around it: threads share it
        super().__init__(runtime, heads, primary, max_length, batch_size)

    def generation_passes(self, heads: list[Head]):
        """Generation's passes on this runtime (infer/generate.Passes): a left-padded torch batch."""
        from adalayers.infer.batching import TorchPasses

        return TorchPasses(self, heads)

    def tapped(self, heads: list[Head], run):
        """run(tap) (a prefill or a decode step of any runtime's decoder) with every head tapping it, under
        this predictor's lock (the heads' per-pass state is shared with other requests): (run's result,
        {head: the accumulator columns of these positions})."""
        with self._lock, torch.no_grad():
            for h in heads:
                h.task.begin()
            tap = shared_tap([h.task for h in heads], defer=STEP_POSITIONS) if heads else None
            out = run(tap)
            if tap is not None:
                tap.flush()  # a decode step's states: every layer at once
            return out, {h.name: h.task.take() for h in heads}

    def forward(self, batch: dict, heads: list[Head], cancelled: Callable[[], bool] | None = None
                ) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """One pass of the runtime over a collated batch, every head tapping it: (the base's own output, each
        head's logits). Without the base's own output (primary=False) the base stops after the deepest layer
        a head uses (early exit). cancelled(): see Runtime.forward."""
        stop = None if self.primary or not heads else used_layers(heads)[-1]
        return self.runtime.forward(batch, heads, stop, cancelled)

    @torch.inference_mode()
    def _run(self, rows: list[dict], heads: list[Head], abandoned: Callable[[], set[int]] | None = None) -> dict:
        """One base pass per batch of rows, all heads tapping it (the engine's one predict loop, batches in
        row order, in this process). -> per row: the base's own output and each head's output (class
        probabilities, per-token probabilities, or the value), cut to the row's real tokens."""
        pad_id = self.backbone.tokenizer.pad_token_id or 0
        left = self.backbone.is_causal  # a decoder's next token: read from the last column

        def outputs(out) -> list[tuple | None]:
            own, logits, size = out
            if logits is None:  # the pass stopped between two layers: nobody waits for its rows
                return [None] * size
            for h, v in zip(heads, logits):
                if not torch.isfinite(v).all():  # never answered as NaN: a server-side fault
                    raise ModelError(f"head {h.name!r} produced non-finite values (NaN or infinity)")
            vals = {h.name: v if h.kind == TaskKind.REGRESSION else torch.softmax(v, -1) for h, v in zip(heads, logits)}
            return [(None if own is None else own[j], {n: v[j] for n, v in vals.items()}) for j in range(size)]

        def step(batch):
            n, texts = len(batch["input_ids"]), {rows[i]["text"] for i in batch["index"].tolist()}
            self.rows_run += n
            if abandoned is None:
                return (*self.forward(batch, heads), n)
            try:  # a micro-batch whose texts all lose their clients while it runs stops at the next layer
                return (*self.forward(batch, heads, lambda: texts <= abandoned()), n)
            except Cancelled:
                self.rows_skipped += n
                return None, None, n

        per_row = predict(step, self._plan(rows, abandoned),
                          lambda idx: collate([rows[i] for i in idx], idx, pad_id, left=left), len(rows),
                          outputs, shard=False)
        base_rows, head_rows = [None] * len(rows), {h.name: [None] * len(rows) for h in heads}
        for i, (row, out) in enumerate(zip(rows, per_row)):
            if out is None:  # skipped: nobody waits for its text
                continue
            own, values = out
            n = len(row["input_ids"])
            for h in heads:
                head_rows[h.name][i] = _real(values[h.name], n, left) if h.kind == TaskKind.TOKENS else values[h.name]
            if own is not None and not row["window"]:
                base_rows[i] = (_real(own, n, left) if own.dim() == 2 else own).float().cpu()
                if not torch.isfinite(base_rows[i]).all():
                    raise ModelError(f"the base {self.backbone.name!r} produced non-finite values")
        return {"base": base_rows, "heads": head_rows}

