"""POST /v1/classify (vLLM's shape, every sequence head) and POST /v1/embeddings (OpenAI's; encoder bases, and
decoder bases pooled as llama-server pools them: --pooling mean or last, SideTasks.embed).

    /v1/classify   {"model": HEAD, "input": ["text", ...] or [["text", "second"], ...] for a pair head}
                   -> {"id", "object": "list", "created", "model", "usage",
                       "data": [{"index", "label", "probs": [one per label, in the head's label order],
                                 "num_classes"}]}        a regression head: label null, probs [value], num_classes 1
    /v1/embeddings {"model": BASE, "input": "text" or ["text", ...], "encoding_format": "float" | "base64"}
                   -> {"object": "list", "data": [{"object": "embedding", "embedding", "index"}], "model", "usage"}

Both are /predict underneath (ServeState.answer_texts): the same limits (serve/validate.py), batching with every other
request, deadline and text rules, so a classify answer equals /predict's for that head and an
encoder's embedding equals /predict's "base" output. A decoder's embeddings run on their own pass
(ServeState.embed_texts): the same limits, --max-queue and deadline.
"""
from __future__ import annotations

import base64
import struct
import time
import uuid

from fastapi import APIRouter, FastAPI, Request

from adalayers.kinds import TaskKind
from adalayers.serve.errors import OpenAIError, OpenAIRoute
from adalayers.serve.protocol import ClassifyRequest, EmbeddingRequest, unsupported
from adalayers.serve.state import ServeState
from adalayers.serve.validate import check_count


def add_routes(app: FastAPI, state: ServeState) -> None:
    side, cfg, name = state.side, state.cfg, state.name
    router = APIRouter(route_class=OpenAIRoute)  # errors in OpenAI's shape

    @router.post("/v1/classify")
    async def classify(req: ClassifyRequest, request: Request):
        arrived = time.perf_counter()
        _supported(req)
        head = side.heads.get(req.model)
        if head is None or head.kind == TaskKind.TOKENS:
            heads = [n for n, h in side.heads.items() if h.kind != TaskKind.TOKENS]
            raise OpenAIError(404, f"the model {req.model!r} is not a sequence head of this server; classify takes "
                                   f"one of: {', '.join(heads) or '(none loaded)'}", "model", "model_not_found")
        texts, pairs = _inputs(req.input, cfg, pairs=head.pairs)
        guards = state.guards if state.guards and state.guards.rules else None
        tasks = guards.text_tasks(side, [req.model], pairs is not None) if guards else [req.model]
        results, tokens = await state.answer_texts(request, arrived, texts, pairs, tasks)
        if guards:
            guards.mark(results, texts, "/v1/classify", [req.model])  # rows that trip a --guard say so
        return {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": req.model, "data": [{**_classification(i, head, r["tasks"][req.model]),
                                              **({"guard": r["guard"]} if "guard" in r else {})}
                                             for i, r in enumerate(results)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                          "prompt_tokens_details": None}}

    @router.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, request: Request):
        arrived = time.perf_counter()
        _supported(req)
        if req.model != name:
            raise OpenAIError(404, f"the model {req.model!r} does not exist; this server embeds with {name!r}",
                              "model", "model_not_found")
        if not side.backbone.is_causal and not side.primary:
            raise OpenAIError(400, f"the base {name} runs without its own output (--no-primary): /v1/embeddings "
                                   "needs an encoder base's sentence embedding", "model", "unsupported_model")
        texts, _ = _inputs(req.input, cfg)
        if side.backbone.is_causal:  # a decoder's last state, pooled (--pooling), as llama-server embeds
            vectors, tokens = await state.embed_texts(texts, arrived)
        else:
            results, tokens = await state.answer_texts(request, arrived, texts, None, [])
            vectors = [(r.get("base") or {}).get("embedding") for r in results]
        if any(v is None for v in vectors):
            raise OpenAIError(400, f"the base {name} has a task head of its own: it gives no sentence embedding",
                              "model", "unsupported_model")
        if req.dimensions is not None and req.dimensions != len(vectors[0]):
            raise OpenAIError(400, f"dimensions {req.dimensions}: the base's embedding has {len(vectors[0])} "
                                   "(it cannot be shortened)", "dimensions", "unsupported_value")
        data = [{"object": "embedding", "index": i,
                 "embedding": v if req.encoding_format == "float" else _base64(v)} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    app.include_router(router)


def _supported(req) -> None:
    problem = unsupported(req)
    if problem:
        raise problem


def _inputs(given, cfg, pairs: bool = False) -> tuple[list[str], list[str] | None]:
    """input as (texts, second texts or None): a string, strings, or [text, second] pairs for a pair head."""
    items = [given] if isinstance(given, str) else list(given)
    check_count(items, cfg.max_texts, "inputs", "text", "input", field="input")
    if any(isinstance(x, int) or (isinstance(x, list) and x and isinstance(x[0], int)) for x in items):
        raise OpenAIError(400, "input as token ids is not supported: give text", "input", "unsupported_value")
    lists = [isinstance(x, list) for x in items]
    if pairs != all(lists) or (any(lists) and not all(lists)):
        raise OpenAIError(400, "this head takes [text, second] pairs" if pairs else
                          "input holds [text, second] pairs, and only a pair head takes them", "input")
    if not pairs:
        return items, None
    bad = [i for i, x in enumerate(items) if len(x) != 2]
    if bad:
        raise OpenAIError(400, f"input[{bad[0]}] has {len(items[bad[0]])} texts; a pair is [text, second]", "input")
    return [x[0] for x in items], [x[1] for x in items]


def _classification(i: int, head, out: dict) -> dict:
    if head.kind == TaskKind.REGRESSION:
        return {"index": i, "label": None, "probs": [out["value"]], "num_classes": 1}
    labels = head.task.labels
    return {"index": i, "label": out["label"], "probs": [out["probabilities"][lab] for lab in labels],
            "num_classes": len(labels)}


def _base64(vector: list[float]) -> str:
    """float32 little-endian bytes in base64: what the `openai` client decodes (its default encoding)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
