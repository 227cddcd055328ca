"""Work the service runs off the event loop, each kind in a lane of its own, so no kind waits behind another.

    passes = Lane("adalayers-pass")              # the base's passes: one thread, in the order they are given
    await passes.run(fn, *args)
    checks = CheckLane(capacity=64, light_size=10_000)   # requests' token counts, before they are queued
    await checks.run(fn, *args, size=chars, gone=event)  # light before heavy; skipped once `gone` is set

asyncio.to_thread gives every caller one shared pool, first come first served. Under a cancel storm (clients
that send a heavy body and hang up a fraction of a second later) the storm's token counts queued in that pool
ahead of every small request's count and ahead of the batcher's next pass: a valid client waited seconds
behind work whose client had already left (issue 56). So:
    - the batcher's passes have their own thread (Lane), which nothing else queues on;
    - a request's token count waits in CheckLane, requests of at most `light_size` characters first (each
      class in arrival order), and is not run at all if its client has left by the time its turn comes: a
      storm's backlog drains at no cost, and a valid request's count never waits behind a heavy one's;
    - at most `capacity` requests wait there, at most half of them heavy; when full, work whose client has left
      gives its place up at once, and if there is still no room the request is refused (Busy: a 503 with
      Retry-After).
"""
from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from adalayers.serve.batching import Busy, heavy_full
from adalayers.serve.errors import ClientGone


class Lane:
    """One worker thread of its own; run() awaits fn(*args) there."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., Any], *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))


class CheckLane:
    """One worker thread taking the waiting work light first (size <= light_size), each class in arrival order;
    work whose `gone` event is set when its turn comes is answered ClientGone without running."""

    def __init__(self, capacity: int, light_size: int, name: str = "adalayers-checks"):
        self.capacity, self.light_size = capacity, light_size
        self.skipped = 0  # work not run: its client had left before its turn
        self._heap: list = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def waiting(self) -> int:
        with self._ready:
            return len(self._heap)

    async def run(self, fn: Callable[..., Any], *args, size: int, gone: threading.Event | None = None) -> Any:
        """fn(*args) on the lane's thread, in its turn; Busy when `capacity` are waiting already, ClientGone when
        `gone` is set before its turn."""
        loop = asyncio.get_running_loop()
        done, heavy = loop.create_future(), size > self.light_size
        with self._ready:
            if self._full(heavy):
                self._purge()
                if self._full(heavy):
                    raise Busy(f"{len(self._heap)} requests wait for their check")
            heapq.heappush(self._heap, (heavy, next(self._order), fn, args, gone, loop, done))
            self._ready.notify()
        return await done

    def _full(self, heavy: bool) -> bool:
        """No room: `capacity` wait, or (for heavy work) half of it is heavy work already, so that a flood of
        heavy requests leaves room for light ones."""
        if len(self._heap) >= self.capacity:
            return True
        return heavy and heavy_full(sum(e[0] for e in self._heap), self.capacity)

    def _purge(self) -> None:
        """Work whose client has left gives its place up now, not at its turn (called with the lock held)."""
        keep = []
        for entry in self._heap:
            gone, loop, done = entry[4], entry[5], entry[6]
            if done.cancelled() or (gone is not None and gone.is_set()):
                self.skipped += 1
                loop.call_soon_threadsafe(_settle, done, None, ClientGone("client disconnected"))
            else:
                keep.append(entry)
        if len(keep) < len(self._heap):
            heapq.heapify(keep)
            self._heap[:] = keep

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._heap:
                    self._ready.wait()
                _, _, fn, args, gone, loop, done = heapq.heappop(self._heap)
            if done.cancelled() or (gone is not None and gone.is_set()):
                self.skipped += 1
                loop.call_soon_threadsafe(_settle, done, None, ClientGone("client disconnected"))
                continue
            try:
                value, error = fn(*args), None
            except BaseException as e:  # noqa: BLE001  (handed to the awaiting request as its own error)
                value, error = None, e
            loop.call_soon_threadsafe(_settle, done, value, error)


def _settle(done: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if done.cancelled():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(value)
