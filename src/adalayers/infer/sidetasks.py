"""Many side tasks from one pass of the base: SideTasks.

    tasks = SideTasks.load("minilm-l6", ["runs/cola", "runs/imdb", "runs/conll"])
    tasks.predict(["John lives in Paris ."])
    # [{"text": ..., "base": {"embedding": [...]}, "tasks": {"cola": {"label", "probabilities"},
    #   "conll": {"words", "tags", "scores", "entities"}, ...}}]

Per batch the base runs once; every head's accumulator is fed by the same layer taps. The batches go
through the engine's one prediction loop (adalayers.engine.predict), whose model here is that pass.

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

import bisect
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from adalayers.store import run as runlib
from adalayers.textcheck import check_texts
from adalayers.model.backbone import Backbone
from adalayers.data.encoding import collate, word_windows
from adalayers.engine.predict import in_order, predict
from adalayers.errors import Cancelled, ConfigError, DataError, ModelError
from adalayers.model.sidetask import shared_tap
from adalayers.data.tasks import check_pairs, takes_pairs
from adalayers.data.templates import Template
from adalayers.kinds import TaskKind

IOB = re.compile(r"^(O|[BIES]-.+)$")


@dataclass
class Head:
    name: str
    task: object          # SideTask
    run_dir: Path
    max_length: int
    pairs: bool = False   # trained on sentence pairs: takes (text, text_pair), refuses single texts
    template: Template = Template()  # task.template it was trained with: its inputs are wrapped the same way

    @property
    def kind(self) -> str:
        return self.task.kind

    def describe(self) -> dict:
        w = self.task.mixer.layer_weights().tolist()
        return {"name": self.name, "kind": self.kind, "pairs": self.pairs, "labels": self.task.labels,
                "layer_weights": [round(x, 6) for x in w], "used_layers": self.task.used_layers(),
                "max_length": self.max_length}  # never the run folder's path: clients need not know it


def parse_head_arg(arg: str) -> tuple[str, Path]:
    """'runs/cola' -> ('cola', runs/cola); 'acc=runs/cola' -> ('acc', runs/cola).

    A Hub id 'user/name[@rev]' that is not a local folder is fetched (adalayers.store.hub): ('name', its snapshot).
    """
    from adalayers.store.hub import resolve_run

    name, sep, path = arg.partition("=")
    if sep and name and "/" not in name:
        return _task_name(name, arg), resolve_run(path)
    return _task_name(Path(arg.partition("@")[0]).name, arg), resolve_run(arg)


def _task_name(name: str, arg: str) -> str:
    """A task name every answer can carry: valid UTF-8 (argv bytes that are not arrive as lone surrogates)
    and printable."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise ConfigError(f"--heads {shown}: the task name is not valid UTF-8; name it with NAME=RUN_FOLDER") from None
    if not name.isprintable():
        raise ConfigError(f"--heads {arg!r}: the task name holds unprintable characters; name it with NAME=RUN_FOLDER")
    return name


def heads_base(run_dirs: list) -> str:
    """The base the heads in `run_dirs` were trained on (their config.json's base name), when they all
    name the same one; otherwise a ModelError that lists them and names --base."""
    named = {str(arg): runlib.read_config(parse_head_arg(str(arg))[1])["base"]["name"] for arg in run_dirs}
    bases = sorted(set(named.values()))
    if not bases:
        raise ModelError("no heads given, so no base to load: name one with --base")
    if len(bases) > 1:
        raise ModelError(f"the heads were trained on different bases ({', '.join(f'{a}: {b}' for a, b in named.items())}); "
                         f"serve the heads of one base together, or choose the base with --base")
    return bases[0]


class SideTasks:
    def __init__(self, backbone: Backbone, heads: list[Head], primary: bool = True,
                 max_length: int | None = None, batch_size: int = 32):
        names = [h.name for h in heads]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ModelError(f"two heads are named {', '.join(dupes)}; name them apart with NAME=RUN_FOLDER")
        self.backbone, self.heads = backbone, {h.name: h for h in heads}
        self.primary, self.batch_size = primary, batch_size
        limit = min(int(getattr(backbone.tokenizer, "model_max_length", 512) or 512), 100_000)
        self.max_length = min(max_length or max([h.max_length for h in heads] or [limit]), limit)
        self._lock = threading.Lock()  # the heads hold per-pass state: one pass at a time
        self.rows_run = 0      # token rows (plain rows and windows) the base has run, all passes together
        self.rows_skipped = 0  # rows of passes stopped early because nobody waited for them (Cancelled)
        for h in heads:
            h.template.check(backbone.tokenizer, backbone.name, h.pairs, h.kind)
        templates = {h.template for h in heads}
        if len(templates) > 1:  # one pass reads one text: heads that wrap it differently cannot share it
            raise ModelError("the heads were trained with different task.template settings ("
                             + "; ".join(f"{h.name}: {h.template.describe()}" for h in heads)
                             + "); serve them separately")
        self.template = templates.pop() if templates else Template()
        if any(h.kind == TaskKind.TOKENS for h in heads) and not backbone.tokenizer.is_fast:
            raise ModelError(f"{backbone.name}: token heads need a fast tokenizer (for character offsets)")

    # --- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, base: str | None, run_dirs: list, primary: bool = True, device: str = "auto",
             backend: str = "torch", **kw) -> "SideTasks":
        """One base (alias, folder or hub id) and the heads in `run_dirs` ('RUN' or 'NAME=RUN').

        base=None: the base every head was trained on (heads_base). backend="onnx" (or "onnx-int8"): one
        exported graph run by ONNX Runtime (adalayers.infer.onnx); `base` may then also be a folder
        written by `adalayers export`. backend="llama.cpp": a GGUF base (alias or .gguf file) run quantized
        by llama.cpp, the heads fed through its eval callback (adalayers.infer.llamacpp_backbone).
        """
        from adalayers.core import pick_device

        base = base or heads_base(run_dirs)
        if backend == "llama.cpp":
            from adalayers.infer.llamacpp_backbone import LlamaCppBackbone

            backbone = LlamaCppBackbone.load(base, threads=kw.pop("threads", None))
            side = cls.from_backbone(backbone, run_dirs, primary, **kw)
            side.batch_size = backbone.rows_per_pass(side.max_length, side.batch_size)
            return side
        if backend != "torch":
            from adalayers.infer.onnx import OnnxSideTasks

            return OnnxSideTasks.load_onnx(base, run_dirs, primary=primary, backend=backend, **kw)

        states = {runlib.read_config(parse_head_arg(str(r))[1])["config"].get("model", {}).get("states", "encoder")
                  for r in run_dirs}
        if len(states) > 1:
            raise ModelError(f"the heads read different hidden states ({', '.join(sorted(states))}); "
                             "serve encoder and decoder heads separately")
        backbone = Backbone.load(base, states.pop() if states else "encoder", pick_device(device))
        return cls.from_backbone(backbone, run_dirs, primary, **kw)

    @classmethod
    def from_backbone(cls, backbone: Backbone, run_dirs: list, primary: bool = True, **kw) -> "SideTasks":
        heads = []
        for arg in run_dirs:
            name, path = parse_head_arg(str(arg))
            task, cfg, _ = runlib.load_head(path, backbone)  # refuses a head trained on another base
            if task.mixer.num_layers != backbone.num_layers:
                raise ModelError(f"{path}: head expects {task.mixer.num_layers} layers, base has {backbone.num_layers}")
            heads.append(Head(name, task.to(backbone.device).eval(), path, cfg.model.max_length, takes_pairs(cfg),
                              Template.of(cfg)))
        return cls(backbone, heads, primary, **kw)

    @property
    def names(self) -> list[str]:
        return list(self.heads)

    def describe(self) -> list[dict]:
        return [h.describe() for h in self.heads.values()]

    def check_tasks(self, tasks: list[str] | None) -> list[str]:
        if tasks is None:
            return self.names
        unknown = [t for t in tasks if t not in self.heads]
        if unknown:
            raise DataError(f"unknown task(s) {', '.join(map(repr, unknown))}; known: {', '.join(self.names)}")
        return list(dict.fromkeys(tasks))

    def select(self, tasks: list[str] | None, pairs: bool) -> list[str]:
        """The heads to answer: the named ones, each checked to take this input (single texts or sentence
        pairs), or, when none are named, every head that takes it."""
        if tasks is None:
            names = [n for n, h in self.heads.items() if h.pairs == pairs]
            if self.heads and not names:
                raise DataError(f"no loaded head takes {'sentence pairs' if pairs else 'single texts'} "
                                f"(heads: {', '.join(f'{n} ({_input(h)})' for n, h in self.heads.items())})")
            return names
        names = self.check_tasks(tasks)
        for n in names:
            check_pairs(f"task {n!r}", self.heads[n].pairs, [] if pairs else None, 0)
        return names

    # --- predicting ------------------------------------------------------------------------
    def predict(self, texts: list[str], tasks: list[str] | None = None,
                text_pairs: list[str] | None = None, windows: list[bool] | None = None,
                abandoned: Callable[[], set[int]] | None = None) -> list[dict]:
        """Every asked head's prediction per text. A head trained on sentence pairs needs `text_pairs`
        (one second text per text); the others refuse them. Without `tasks`: the heads that take the input.
        `windows`: per text, whether its long text is split into windows for the token heads (default: for
        every text when a token head is asked); a text without them gets token-head answers from its plain
        (truncated) row. `abandoned`: asked before every micro-batch of the pass, the indices of the texts
        nobody waits for any more: their rows are skipped from then on and their results are None; when it
        names every text the pass stops (Cancelled)."""
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise DataError(f"{len(texts)} texts but {len(text_pairs)} second texts: give one second text per text")
        names = self.select(tasks, text_pairs is not None)
        check_texts(texts)  # the same rule as `adalayers predict`
        check_texts(text_pairs or [], what="second text")
        heads = [self.heads[n] for n in names]
        wrapped, second = self.wrap(texts, text_pairs)
        if second is not None:
            rows, spans = self._pair_rows(wrapped, second), [[] for _ in texts]
        else:
            tokens = any(h.kind == TaskKind.TOKENS for h in heads)
            rows, spans = self._rows(wrapped, [tokens and w for w in windows] if windows else [tokens] * len(texts))
        with self._lock, torch.inference_mode():
            outs = self._run(rows, heads, abandoned)
        skipped = {rows[r]["text"] for r, out in enumerate(outs["heads"][heads[0].name]) if out is None} if heads \
            else set()
        results = [None if i in skipped else self._result(i, text, rows, outs, heads, spans[i])
                   for i, text in enumerate(wrapped)]
        for r, text in zip(results, texts):
            if r is not None:
                r["text"] = text  # the caller's text, not the wrapped one
        for r, second in zip(results, text_pairs or []):
            if r is not None:
                r["text_pair"] = second
        return results

    def wrap(self, texts: list[str], text_pairs: list[str] | None = None) -> tuple[list[str], list[str] | None]:
        """The texts as the base reads them: wrapped by the heads' task.template (adalayers.data.templates)."""
        return self.template.apply(self.backbone.tokenizer, texts, text_pairs)

    def _pair_rows(self, texts: list[str], text_pairs: list[str]) -> list[dict]:
        """One row per pair, encoded as in training (the tokenizer's pair encoding, longest-first truncation)."""
        enc = self._tokenize(texts, text_pairs, truncation=True, max_length=self.max_length)
        full = self._tokenize(texts, text_pairs, verbose=False)["input_ids"]
        rows = []
        for i in range(len(texts)):
            row = self._row(enc, i, i, 0, [])
            row["pair_truncated"] = len(full[i]) > self.max_length
            rows.append(row)
        return rows

    def generate(self, prompts: list[str], max_new_tokens: int = 32, tasks: list[str] | None = None,
                 **kw) -> list[dict]:
        """Generated text plus every side task on the prompt and on prompt + answer, from the generation
        pass itself (a decoder LLM base; see adalayers.infer.generate for the options)."""
        from adalayers.infer.generate import generate
        return generate(self, prompts, max_new_tokens, tasks, **kw)

    def _tokenize(self, *texts, **kw):
        """The tokenizer, its failures turned into a DataError (the service answers it 422, alone)."""
        try:
            return self.backbone.tokenizer(*texts, **kw)
        except Exception as e:  # noqa: BLE001  (tokenizers raise assorted types on unreadable input)
            raise DataError(f"the tokenizer cannot read the text(s): {type(e).__name__}: {e}") from None

    def count_tokens(self, texts: list[str], tasks: list[str] | None = None,
                     text_pairs: list[str] | None = None) -> list[int]:
        """Tokens the base runs per text: its plain row, n + s tokens at most max_length (s special
        tokens), plus, when a token head is asked for and n > max_length - s, its windows:
        n + s * ceil(n / (max_length - s)) more (a sentence pair: its one row, at most max_length).
        Used to bound the work of a request and of a batch."""
        check_texts(texts)
        if text_pairs is not None:
            check_texts(text_pairs, what="second text")
        texts, text_pairs = self.wrap(texts, text_pairs)
        if text_pairs is not None:
            return [min(len(ids), self.max_length) for ids in
                    self._tokenize(texts, text_pairs, verbose=False)["input_ids"]]
        windows = any(self.heads[n].kind == TaskKind.TOKENS for n in self.check_tasks(tasks))
        special = self.backbone.tokenizer.num_special_tokens_to_add(pair=False)
        budget = max(1, self.max_length - special)
        counts = []
        for ids in self._tokenize(texts, add_special_tokens=False, verbose=False)["input_ids"]:
            n = len(ids)
            counts.append(min(n, budget) + special + (n + special * -(-n // budget) if windows and n > budget else 0))
        return counts

    def _rows(self, texts: list[str], windows: list[bool]) -> tuple[list[dict], list[list[tuple[int, int]]]]:
        """Token rows: one plain (truncated) row per text, then word-boundary windows of the long texts
        whose `windows` flag is set."""
        tok = self.backbone.tokenizer
        spans = [[m.span() for m in re.finditer(r"\S+", t)] for t in texts]
        enc = self._tokenize(texts, truncation=True, max_length=self.max_length, return_offsets_mapping=tok.is_fast)
        budget = self.max_length - tok.num_special_tokens_to_add(pair=False)
        full = self._tokenize(texts, add_special_tokens=False, return_offsets_mapping=tok.is_fast, verbose=False)
        rows = [self._row(enc, i, i, 0, spans[i]) for i in range(len(texts))]
        for i, row in enumerate(rows):  # truncated: tokens were cut, not merely characters the tokenizer drops
            row["truncated"] = len(full["input_ids"][i]) > budget
        if not any(windows):
            return rows, spans
        cuts = []  # (text index, character span of the window)
        for i, text in enumerate(texts):
            if not windows[i] or len(full["input_ids"][i]) <= budget:
                continue
            rows[i]["token_rows"] = False  # the token heads read this text's windows instead
            rows[i]["windows"] = []
            counts = [0] * len(spans[i])
            for w in _word_ids(full["offset_mapping"][i], spans[i], 0):
                if w is not None:
                    counts[w] += 1
            cuts += [(i, spans[i][a][0], spans[i][b - 1][1]) for a, b in word_windows(counts, budget)]
        if cuts:
            wenc = self._tokenize([texts[i][a:b] for i, a, b in cuts], truncation=True, max_length=self.max_length,
                                  return_offsets_mapping=True)
            for r, (i, a, _) in enumerate(cuts):
                rows[i]["windows"].append(len(rows))
                rows.append(self._row(wenc, r, i, a, spans[i], window=True))
        return rows, spans

    @staticmethod
    def _row(enc, r: int, text: int, offset: int, spans, window: bool = False) -> dict:
        row = {"input_ids": enc["input_ids"][r], "text": text, "window": window, "token_rows": True}
        if "token_type_ids" in enc:
            row["token_type_ids"] = enc["token_type_ids"][r]
        if "offset_mapping" in enc:
            row["word_ids"] = _word_ids(enc["offset_mapping"][r], spans, offset)
        return row

    def _run(self, rows: list[dict], heads: list[Head], abandoned: Callable[[], set[int]] | None = None) -> dict:
        """One base pass per batch of rows, all heads tapping it (the engine's one predict loop, batches in
        row order, in this process). -> per row: the base's own output and each head's output (class
        probabilities, per-token probabilities, or the value), cut to the row's real tokens."""
        tasks = [h.task for h in heads]
        stop = None if self.primary or not tasks else max(max(t.used_layers()) for t in tasks)
        pad_id = self.backbone.tokenizer.pad_token_id or 0
        left = self.backbone.is_causal  # a decoder's next token: read from the last column

        def outputs(out) -> list[tuple]:
            own, logits, size = out
            for h in heads:
                if not torch.isfinite(logits[h.name]).all():  # never answered as NaN: a server-side fault
                    raise ModelError(f"head {h.name!r} produced non-finite values (NaN or infinity)")
            vals = {h.name: logits[h.name] if h.kind == TaskKind.REGRESSION else torch.softmax(logits[h.name], -1)
                    for h in heads}
            return [(None if own is None else own[j], {n: v[j] for n, v in vals.items()})
                    for j in range(size)]

        def step(batch):
            self.rows_run += len(batch["input_ids"])
            return (*self._forward(batch, heads, stop), len(batch["input_ids"]))

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

    def _plan(self, rows: list[dict], abandoned: Callable[[], set[int]] | None):
        """The micro-batches of row indices, in order; before each, the rows of texts nobody waits for are
        left out (counted in rows_skipped), and once no text is waited for the pass stops (Cancelled)."""
        texts, seen = len({r["text"] for r in rows}), 0
        for idx in in_order(len(rows), self.batch_size):
            gone = abandoned() if abandoned is not None else set()
            if gone and len(gone) >= texts:
                self.rows_skipped += len(rows) - seen
                raise Cancelled("nobody waits for this pass any more")
            seen += len(idx)
            keep = [i for i in idx if rows[i]["text"] not in gone]
            self.rows_skipped += len(idx) - len(keep)
            if keep:
                yield keep

    def _forward(self, batch: dict, heads: list[Head], stop: int | None):
        """One pass of the base over a batch: (its own output or None, {head name: float logits on the CPU}).

        The backend seam: adalayers.infer.onnx.OnnxSideTasks answers the same from ONNX Runtime.
        """
        tasks = [h.task for h in heads]
        for t in tasks:
            t.begin()
        base = self.backbone(batch, taps=[shared_tap(tasks)], stop_after=stop)
        logits = {h.name: h.task.end(batch["attention_mask"]).float().cpu() for h in heads}
        own = None if stop is not None else (base.logits if base.logits is not None else base.pooled)
        return own, logits

    def _result(self, i: int, text: str, rows, outs, heads: list[Head], spans) -> dict:
        plain = rows[i]
        result = {"text": text, "truncated": plain.get("pair_truncated", plain.get("truncated", False))}
        if self.primary:
            result["base"] = self._base_output(outs["base"][i], text, spans, plain)
        result["tasks"] = {}
        for h in heads:
            if h.kind == TaskKind.TOKENS:  # the plain row when the text fits, else the text's windows
                mine = [(rows[r], outs["heads"][h.name][r]) for r in [i] + plain.get("windows", [])
                        if rows[r]["token_rows"]]
                result["tasks"][h.name] = _tag_words(h.task.labels, text, spans, mine)
            else:
                result["tasks"][h.name] = _sequence_output(h.kind, h.task.labels, outs["heads"][h.name][i])
        return result

    def _base_output(self, out: torch.Tensor | None, text: str, spans, row: dict) -> dict | None:
        """A base with its own task head: that head's prediction; otherwise the sentence embedding."""
        if out is None:
            return None
        model = self.backbone.model
        if self.backbone.is_causal:  # a decoder LLM: its next token after the text
            probs = torch.softmax(out[-1], -1)
            best = int(probs.argmax())
            return {"next_token": self.backbone.tokenizer.decode([best]), "probability": float(probs[best])}
        if not type(model).__name__.endswith(("ForSequenceClassification", "ForTokenClassification")):
            return {"embedding": out.tolist()}
        labels = [model.config.id2label.get(j, str(j)) for j in range(out.shape[-1])]
        if out.dim() == 2:  # a token-classification base
            if "pair_truncated" in row:
                return None  # words of a sentence pair: not tagged
            return _tag_words(labels, text, spans, [(row, torch.softmax(out, -1))])
        return _sequence_output(TaskKind.CLASSIFICATION, labels, torch.softmax(out, -1))


def _input(head: Head) -> str:
    return "sentence pairs" if head.pairs else "single texts"


def _real(values: torch.Tensor, n: int, left: bool) -> torch.Tensor:
    """A row's n real positions out of its padded values (padding on the left or the right)."""
    return values[values.shape[0] - n:] if left else values[:n]


def _word_ids(offsets, spans, shift: int) -> list[int | None]:
    """Token -> index of the whitespace-separated word holding its first character (None: special)."""
    starts = [a for a, _ in spans]
    ids = []
    for a, b in offsets:
        if b <= a:
            ids.append(None)
            continue
        w = bisect.bisect_right(starts, a + shift) - 1
        ids.append(w if w >= 0 and a + shift < spans[w][1] else None)
    return ids


def _sequence_output(kind: str, labels: list[str], values: torch.Tensor) -> dict:
    if kind == TaskKind.REGRESSION:
        return {"value": float(values)}
    probs = values.tolist()
    best = max(range(len(probs)), key=probs.__getitem__)
    return {"label": labels[best], "probabilities": dict(zip(labels, probs))}


def _tag_words(labels: list[str], text: str, spans, rows) -> dict:
    """Per word: the tag of its first sub-token, that tag's probability; IOB2 tags also as entity spans."""
    outside = labels.index("O") if "O" in labels else 0
    tags, scores = [labels[outside]] * len(spans), [None] * len(spans)
    for row, probs in rows:
        for pos, w in enumerate(row["word_ids"]):
            if w is None or scores[w] is not None:
                continue  # special token, or not the word's first sub-token
            best = int(probs[pos].argmax())
            tags[w], scores[w] = labels[best], float(probs[pos, best])
    out = {"words": [text[a:b] for a, b in spans], "tags": tags, "scores": scores}
    if all(IOB.match(t) for t in labels):
        from seqeval.metrics.sequence_labeling import get_entities

        out["entities"] = [{"type": kind, "text": text[spans[a][0]:spans[b][1]], "start": spans[a][0],
                            "end": spans[b][1], "words": [a, b + 1]} for kind, a, b in get_entities(tags)]
    return out
