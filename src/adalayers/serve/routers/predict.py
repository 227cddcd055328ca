"""/predict and its description of the heads:

    POST /predict  {"texts": [...], "tasks": [...optional subset...]}  -> {"results": [one object per text]}
                   sentence pairs: {"texts": [["a", "b"], ...]} or {"texts": ["a", ...], "text_pairs": ["b", ...]}
    GET  /tasks    the heads: names, kinds, labels, layer weights (never the server's run folder paths)

A request is checked alone (serve/validate.py, through ServeState.answer_texts: --max-texts, --max-chars,
--max-tokens, text rules, task names), then batched with every other request waiting (serve/batcher.py).
"""
from __future__ import annotations

import time

from fastapi import FastAPI, Request

from adalayers.serve.errors import BadText
from adalayers.serve.protocol import PredictRequest, PredictResponse
from adalayers.serve.state import ServeState
from adalayers.serve.validate import check_count

RESPONSES = {401: {"description": "API key missing or wrong"}, 408: {"description": "read timeout"},
             413: {"description": "too large"}, 422: {"description": "invalid input"},
             503: {"description": "queue full or deadline passed; see Retry-After"}}


def add_routes(app: FastAPI, state: ServeState) -> None:
    side, cfg = state.side, state.cfg

    @app.post("/predict", response_model=PredictResponse, responses=RESPONSES)
    async def predict(req: PredictRequest, request: Request):
        arrived = time.perf_counter()
        check_count(req.texts, cfg.max_texts, "texts", "text")
        texts, text_pairs = _split_pairs(req)
        guards = state.guards
        tasks = guards.text_tasks(side, req.tasks, text_pairs is not None) if guards else req.tasks
        results, _ = await state.answer_texts(request, arrived, texts, text_pairs, tasks)
        if guards and guards.rules:
            guards.mark(results, texts, "/predict", req.tasks)  # rows that trip a --guard say so
        if not req.base:
            for r in results:
                r.pop("base", None)
        return {"results": results}

    @app.get("/tasks")
    async def tasks():
        return {"base": state.name, "fingerprint": side.backbone.fingerprint(), "primary": side.primary,
                "max_length": side.max_length, "tasks": side.describe(),
                "generates": side.backbone.is_causal}  # a decoder LLM: /generate and /generate/stream answer


def _split_pairs(req: PredictRequest) -> tuple[list[str], list[str] | None]:
    """texts of strings (+ optional text_pairs), or texts of [text, second] lists -> (texts, second texts)."""
    lists = [isinstance(t, list) for t in req.texts]
    if not any(lists):
        if req.text_pairs is not None and len(req.text_pairs) != len(req.texts):
            raise BadText(f"{len(req.texts)} texts but {len(req.text_pairs)} text_pairs: give one second text "
                          "per text")
        return list(req.texts), req.text_pairs
    if not all(lists) or req.text_pairs is not None:
        raise BadText("texts mixes single texts and [text, second] pairs (or pairs and text_pairs): give one "
                      "kind per request")
    bad = [i + 1 for i, t in enumerate(req.texts) if len(t) != 2]
    if bad:
        raise BadText(f"text {bad[0]} is a list of {len(req.texts[bad[0] - 1])} texts; a sentence pair is "
                      "[text, second]")
    return [t[0] for t in req.texts], [t[1] for t in req.texts]
