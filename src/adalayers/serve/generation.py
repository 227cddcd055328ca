"""The generation service: the one path every generating route takes (as vLLM's OpenAIServing is one).

    started = await service.begin(prompts, params, route, arrived)       # decode -> admit -> first event
    results = await service.finish(started, results_of, arrived, request)   # POST /generate: the rest, in time
    body = await service.finish(started, shape.response)                    # /v1 non-stream: to its end
    return service.sse(started, frames)                                     # every stream

begin: the request is opened on the service's decoder (ServeState.decode: the continuous-batching scheduler
or infer/generate.start, with the server's guards and metrics); a bad one is a BadRequest (400) before it
counts. It is admitted under --max-queue with the batcher's work (QueueFull, 503 with Retry-After). Its first
event (the prefill, after any wait for room) must come within --request-timeout (Expired, 503). With a request
(POST /generate), a client that leaves stops it too (ClientGone, 499, never sent). A generation stopped so is
cancelled (infer/generate.Stream.cancel: it leaves the queue, or its rows leave at the next decode step) and
counted (the batcher's generations_stopped); its slot is given back once its worker has let go of it.

finish runs the rest of the events through `consume` in a worker thread (bounded by the same deadline when
`arrived` is given); sse streams them as server-sent events, each written by frames(first, events) (frame:
one event's bytes), and gives the slot back when the stream ends, or when a response never started is dropped.
Errors are the typed errors of serve/errors.py: each router answers them in its shape.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from adalayers.errors import AdaLayersError
from adalayers.infer.params import GenerationParams
from adalayers.serve.batching import Batcher
from adalayers.serve.errors import BadRequest, ClientGone, Expired, QueueFull, RequestError
from adalayers.serve.limits import client_gone


def frame(data: dict, event: str | None = None, ascii_only: bool = True) -> str:
    """One server-sent event: `event: NAME` (when named) and `data: JSON`."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=ascii_only)}\n\n"


@dataclass
class Started:
    """A generation admitted and prefilled: its events, the first one (already read), its slot's release."""
    events: Any
    first: dict
    release: Callable[[], None]

    def close(self) -> None:
        self.events.close()
        self.release()


_END = object()


def _produce(started: Started, frames, loop: asyncio.AbstractEventLoop, made: asyncio.Queue) -> None:
    """A stream's thread: every frame (then an error, if frames raised one, then _END) into `made`, on the loop;
    the generation closed and its slot given back by this thread, which consumed its events."""
    def hand(item) -> None:
        try:
            loop.call_soon_threadsafe(made.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server has stopped
            pass
    try:
        for chunk in frames(started.first, started.events):
            hand(chunk)
    except BaseException as e:  # noqa: BLE001  (raised in the response's task, as an iterator's error would be)
        hand(e)
    finally:
        started.close()
        hand(_END)


class GenerationService:
    """The path of every generating route, over the service's decoder and batcher (see the module doc)."""

    def __init__(self, decode: Callable, batcher: Batcher, timeout_s: float):
        self.decode, self.batcher, self.timeout_s = decode, batcher, timeout_s

    def busy(self) -> QueueFull:
        return QueueFull(f"the queue is full ({self.batcher.max_queue} requests pending, --max-queue); retry later",
                         headers={"Retry-After": str(self.batcher.retry_after_s())})

    def expired(self) -> Expired:
        return Expired(f"not answered within {self.timeout_s:g} s (--request-timeout); retry later",
                       headers={"Retry-After": str(self.batcher.retry_after_s())})

    async def begin(self, prompts: list[str], params: GenerationParams, route: str, arrived: float,
                    request_id: str | None = None, request: Request | None = None) -> Started:
        """Open, admit and prefill (see the module doc)."""
        try:
            events = self.decode(prompts, params, route=route, request_id=request_id)
        except AdaLayersError as e:
            raise BadRequest(str(e), "adalayers") from None
        release = self.batcher.admit()
        if release is None:
            events.close()
            raise self.busy()
        started = Started(events, {}, release)
        try:
            started.first = await self._in_time(lambda: next(events), started, arrived, request, started.close)
        except AdaLayersError as e:
            if isinstance(e, RequestError):
                raise
            started.close()
            raise BadRequest(str(e), "adalayers") from None
        except BaseException:
            started.close()
            raise
        return started

    async def finish(self, started: Started, consume: Callable[[Iterator[dict]], Any], arrived: float | None = None,
                     request: Request | None = None, failed: Callable[[Exception], Exception] | None = None) -> Any:
        """consume(every event, the first included) in a worker thread; its AdaLayersError is failed(error).
        With `arrived`, within the request's deadline (and, with `request`, while its client stays)."""
        def run():
            try:
                return consume(with_first(started.first, started.events))
            finally:
                started.close()  # the slot is given back once the worker lets go, in time or not
        try:
            return await self._in_time(run, started, arrived, request, lambda: None)
        except RequestError:
            raise
        except AdaLayersError as e:
            raise (failed or (lambda error: BadRequest(str(error))))(e) from None

    def sse(self, started: Started, frames: Callable[[dict, Iterator[dict]], Iterator[str]]) -> StreamingResponse:
        """frames(first, events) runs in a thread of its own for the whole stream and hands each frame to the
        event loop as it is made. (Starlette iterates a plain iterator with a worker-thread round trip per item:
        three thread switches a token, each taking the interpreter from or beside llama.cpp's threads.)"""
        async def body():
            loop, made = asyncio.get_running_loop(), asyncio.Queue()
            worker = threading.Thread(target=_produce, args=(started, frames, loop, made), daemon=True,
                                      name="adalayers-stream")
            worker.start()
            try:
                while (item := await made.get()) is not _END:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
            finally:
                if worker.is_alive():  # the client left (or the server stops): its rows leave at the next step
                    started.events.cancel("the client of this stream left")

        stream = body()
        weakref.finalize(stream, started.release)  # a stream never started still gives its slot back
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _in_time(self, fn: Callable[[], Any], started: Started, arrived: float | None,
                       request: Request | None, let_go: Callable[[], None]) -> Any:
        """fn() in a worker thread. Past the deadline (when `arrived` is given) or once the client leaves (with
        `request`): the generation is cancelled and counted, let_go() runs once the worker has let go of it,
        and Expired (or ClientGone) is raised."""
        work = asyncio.ensure_future(asyncio.to_thread(fn))
        if arrived is None:
            return await work
        gone = asyncio.create_task(client_gone(request)) if request is not None else None
        left = max(0.0, self.timeout_s - (time.perf_counter() - arrived))
        try:
            await asyncio.wait({work} | ({gone} if gone else set()), timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if gone is not None:
                gone.cancel()
        if work.done():
            return work.result()
        started.events.cancel(f"nobody waits for this generation any more ({left:.3g} s were left)")
        work.add_done_callback(lambda f: (let_go(), f.cancelled() or f.exception()))
        self.batcher.generations_stopped += 1
        if gone is not None and gone.done() and not gone.cancelled():
            raise ClientGone("client disconnected")  # never sent
        raise self.expired()


def with_first(first: dict, events) -> Iterator[dict]:
    """The first event (already read), then the rest."""
    yield first
    yield from events
