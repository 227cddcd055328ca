"""One batch of rows -> one Arrow table of predictions: the model step of both predict-files engines.

BatchPredictor is Ray Data's callable class (one per actor) and the local engine's model alike, so both
engines run the same code: SideTasks.predict (one base pass per batch for every head, primary output
off) and the same conversion to columns:

    id                  the input's id column, as text
    <task>_label        sequence task: the most probable label      <task>_score  its probability
    <task>_value        regression task: the predicted value
    <task>_words        token task: the text's whitespace-separated words   <task>_tags  one tag per word

Sentence pairs: with a second-text column every row is (text, second text) and every head must have been
trained on pairs; without one, every head must take single texts (check_heads, before any model loads).
"""
from __future__ import annotations

import logging

import pyarrow as pa

from adalayers.errors import DataError
from adalayers.kinds import TaskKind
from adalayers.store.head_spec import HeadSpec
from adalayers.textcheck import text_problem

log = logging.getLogger(__name__)


def check_heads(heads: list[HeadSpec], pairs: bool) -> None:
    """Refuse, from the run folders' configs alone, heads that do not take this input: a mix of pair and
    single-text heads (one input per job), else tasks.check_pairs' own rule for each head."""
    from adalayers.store.run import run_config
    from adalayers.data.tasks import check_pairs, takes_pairs

    takes = {h.name: takes_pairs(run_config(h.path)) for h in heads}
    if len(set(takes.values())) > 1:
        pair_heads = ", ".join(n for n, t in takes.items() if t)
        single = ", ".join(n for n, t in takes.items() if not t)
        raise DataError(f"predict-files runs heads of one input kind per job, got sentence-pair heads ({pair_heads}) "
                        f"and single-text heads ({single}): run the pair heads with --text-pair-column and the "
                        f"others without it, into two --output folders")
    for name, t in takes.items():
        check_pairs(f"head {name!r}", t, [] if pairs else None, 0)


def schema(heads: dict[str, str]) -> pa.Schema:
    """The output columns for heads {name: kind}."""
    fields = [pa.field("id", pa.string())]
    for name, kind in heads.items():
        if kind == TaskKind.TOKENS:
            fields += [pa.field(f"{name}_words", pa.list_(pa.string())), pa.field(f"{name}_tags", pa.list_(pa.string()))]
        elif kind == TaskKind.REGRESSION:
            fields.append(pa.field(f"{name}_value", pa.float64()))
        else:
            fields += [pa.field(f"{name}_label", pa.string()), pa.field(f"{name}_score", pa.float64())]
    return pa.schema(fields)


def to_table(ids: list[str], results: list[dict], heads: dict[str, str]) -> pa.Table:
    """SideTasks.predict results -> the output table (schema above)."""
    cols: dict[str, list] = {"id": ids}
    for name, kind in heads.items():
        outs = [r["tasks"][name] for r in results]
        if kind == TaskKind.TOKENS:
            cols[f"{name}_words"] = [o["words"] for o in outs]
            cols[f"{name}_tags"] = [o["tags"] for o in outs]
        elif kind == TaskKind.REGRESSION:
            cols[f"{name}_value"] = [o["value"] for o in outs]
        else:
            cols[f"{name}_label"] = [o["label"] for o in outs]
            cols[f"{name}_score"] = [o["probabilities"][o["label"]] for o in outs]
    return pa.Table.from_pydict(cols, schema=schema(heads))


class BatchPredictor:
    """Loads the base and heads once; called with a batch (Arrow table or {column: values}) of id + text
    (+ second text, with `text_pair_column`)."""

    def __init__(self, base: str, heads: list[str | HeadSpec], id_column: str = "id", text_column: str = "text",
                 device: str = "cpu", max_length: int | None = None, batch_size: int = 32,
                 num_threads: int | None = None, skip_bad_rows: bool = False, text_pair_column: str | None = None,
                 runtime: str = "torch"):
        import torch

        from adalayers.infer.sidetasks import SideTasks

        if num_threads:
            torch.set_num_threads(num_threads)
        self.side = SideTasks.load(base, heads, primary=False, device=device, max_length=max_length,
                                   batch_size=batch_size, runtime=runtime, threads=num_threads)
        self.heads = {h.name: h.kind for h in self.side.heads.values()}
        self.id_column, self.text_column, self.skip_bad_rows = id_column, text_column, skip_bad_rows
        self.text_pair_column = text_pair_column

    def predict(self, ids: list[str], texts: list[str], text_pairs: list[str] | None = None) -> pa.Table:
        # every loaded head by name: SideTasks.predict refuses, in one line, a pair head given single texts
        # and a single-text head given pairs (tasks.check_pairs)
        if not texts:
            return to_table(ids, [], self.heads)
        return to_table(ids, self.side.predict(texts, list(self.heads), text_pairs=text_pairs), self.heads)

    def __call__(self, batch) -> pa.Table:
        """Ray Data's entry: rows without an id or text (or second text) are errors (or dropped with
        skip_bad_rows)."""
        column = (lambda c: batch.column(c).to_pylist()) if isinstance(batch, pa.Table) else (lambda c: list(batch[c]))
        ids, texts = column(self.id_column), column(self.text_column)
        seconds = column(self.text_pair_column) if self.text_pair_column else None
        keep = []
        for i, (id_, text) in enumerate(zip(ids, texts)):
            missing = [c for c, v in ((self.text_column, text), (self.text_pair_column, seconds and seconds[i]))
                       if c and text_problem(v) is not None]  # textcheck's rule: blank, zero-width, lone surrogates
            if id_ is not None and not missing:
                keep.append(i)
            elif not self.skip_bad_rows:
                raise DataError(f"the row with {self.id_column} {id_!r} has no text in column {missing[0]!r} "
                                f"(use --skip-bad-rows to skip such rows)" if missing else
                                f"a row has no value in the id column {self.id_column!r} "
                                f"(use --skip-bad-rows to skip such rows)")
            else:
                log.warning("skipped the row with %s %r: %s", self.id_column, id_,
                            f"no text in column {missing[0]!r}" if missing else "no id")
        return self.predict([str(ids[i]) for i in keep], [texts[i] for i in keep],
                            [seconds[i] for i in keep] if seconds is not None else None)
