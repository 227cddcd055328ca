"""A generation's work within a request's deadline (--request-timeout), without holding a worker past it.

    ok, first = await within(lambda: next(events), events, seconds_left, finish=lambda: (events.close(), release()))

`fn` runs in a worker thread. When it ends in time, (True, its result) (its exception is raised). When the
deadline passes first, the stream is cancelled (infer/generate.Stream.cancel: it leaves the scheduler's queue, or
its rows leave at the next decode step, and the worker's wait for the next event ends at once), `finish` runs
once the worker has let go of the stream, and (False, None) is returned: the caller answers 503.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable


async def within(fn: Callable[[], Any], events, seconds: float, finish: Callable[[], Any]) -> tuple[bool, Any]:
    work = asyncio.ensure_future(asyncio.to_thread(fn))
    done, _ = await asyncio.wait({work}, timeout=max(0.0, seconds))
    if done:
        return True, work.result()
    events.cancel(f"not answered within the request's deadline ({seconds:.3g} s were left)")
    work.add_done_callback(lambda f: (finish(), f.cancelled() or f.exception()))
    return False, None
