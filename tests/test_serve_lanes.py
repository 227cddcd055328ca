"""The service's lanes (serve/lanes.py): a request's token count waits light first and is skipped once its client
has left; a full lane refuses at once; the batcher keeps half its queue for small requests (serve/batcher.py)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from adalayers.serve.batcher import MicroBatcher
from adalayers.serve.batching import Busy
from adalayers.serve.errors import ClientGone
from adalayers.serve.lanes import CheckLane, Lane


async def _occupy(lane: CheckLane, hold: threading.Event) -> asyncio.Future:
    """Work that holds the lane's thread until `hold` is set, once the thread has taken it."""
    taken = threading.Event()
    first = asyncio.ensure_future(lane.run(lambda: taken.set() or hold.wait(), size=1000))
    while not taken.is_set():
        await asyncio.sleep(0.001)
    return first


def test_light_work_goes_first_and_work_whose_client_left_never_runs():
    async def main():
        lane, ran = CheckLane(capacity=10, light_size=100), []
        hold = threading.Event()
        first = await _occupy(lane, hold)
        left = threading.Event()
        heavy = asyncio.ensure_future(lane.run(ran.append, "heavy", size=1000))
        gone = asyncio.ensure_future(lane.run(ran.append, "gone", size=1000, gone=left))
        light = asyncio.ensure_future(lane.run(ran.append, "light", size=10))
        await asyncio.sleep(0.01)
        left.set()
        hold.set()
        await asyncio.gather(first, heavy, light)
        with pytest.raises(ClientGone):
            await gone
        assert ran == ["light", "heavy"] and lane.skipped == 1
    asyncio.run(main())


def test_a_full_lane_refuses_and_errors_reach_their_request():
    async def main():
        lane, hold = CheckLane(capacity=1, light_size=100), threading.Event()
        first = await _occupy(lane, hold)
        queued = asyncio.ensure_future(lane.run(lambda: 1 / 0, size=1))
        await asyncio.sleep(0.01)
        assert lane.waiting() == 1
        with pytest.raises(Busy):
            await lane.run(print, size=1)
        hold.set()
        await first
        with pytest.raises(ZeroDivisionError):
            await queued
        assert await Lane("test-lane").run(sum, [1, 2]) == 3
    asyncio.run(main())


def test_a_full_lane_keeps_room_for_light_work_and_makes_room_from_work_whose_client_left():
    async def main():
        lane, hold = CheckLane(capacity=4, light_size=100), threading.Event()
        first = await _occupy(lane, hold)
        left = threading.Event()
        heavy = [asyncio.ensure_future(lane.run(int, size=1000, gone=left)) for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(Busy):  # half the lane is heavy work already
            await lane.run(int, size=1000)
        light = [asyncio.ensure_future(lane.run(int, size=1)) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert lane.waiting() == 4
        left.set()  # the heavy requests' client has gone: a new request takes their place
        again = asyncio.ensure_future(lane.run(int, size=1000))
        await asyncio.sleep(0.01)
        assert lane.skipped == 2 and lane.waiting() == 3
        hold.set()
        await asyncio.gather(first, again, *light)
        for h in heavy:
            with pytest.raises(ClientGone):
                await h
    asyncio.run(main())


def test_heavy_requests_hold_at_most_half_the_queue():
    async def main():
        b = MicroBatcher(None, max_batch=8, max_wait_s=0, max_queue=4, slice_s=1.0)
        b.tokens_per_s = 100.0  # a slice: 100 tokens
        heavy = [b.submit(["x"], [], 500) for _ in range(2)]
        with pytest.raises(Busy):
            b.submit(["x"], [], 500)
        light = [b.submit(["x"], [], 10) for _ in range(2)]
        with pytest.raises(Busy):
            b.submit(["x"], [], 10)
        heavy[0].future.cancel()  # its client left: it stops counting at once
        await asyncio.sleep(0)
        assert b.pending == 3 and b.heavy_pending == 1
        b.submit(["x"], [], 500)
        assert b.refused == 2 and len(light) == 2
    asyncio.run(main())


def test_a_group_holds_one_kind_of_job_and_at_most_one_slice_of_work():
    """A short request never shares a pass with a large one's slice (a pass it could not stop), and a group of
    short ones holds one slice of work at most (issue 56: valid requests waited 1.5 s together behind such passes)."""
    async def main():
        b = MicroBatcher(None, max_batch=64, max_wait_s=0.05, max_queue=16, slice_s=1.0)
        b.tokens_per_s = 100.0  # a slice: 100 tokens
        groups, ran = [], asyncio.Event()

        async def record(group):
            groups.append([job.tokens for job in group])
            if len(groups) == 3:
                ran.set()
        b._run_group = record
        for tokens in (10, 500, 40, 60, 30):  # 500: one text, a first slice of its own (more than a slice)
            b.submit(["x"], [], tokens)
        worker = asyncio.ensure_future(b.run())
        await asyncio.wait_for(ran.wait(), 5)
        worker.cancel()
        assert groups == [[10, 40], [60, 30], [500]]
    asyncio.run(main())


def test_clients_take_turns_in_the_queue():
    """Issue 56's poison soak: one client's eight concurrent requests all went before another client's one request
    that came just after them. With start-time fair queueing each client's requests take turns: a burst goes
    first only by its first request, and the order is arrival order again when one client sends everything."""
    async def main(clients):
        b = MicroBatcher(None, max_batch=1, max_wait_s=0, max_queue=32, slice_s=1.0)
        b.tokens_per_s = 1000.0  # a slice: 1,000 tokens; every job here is at most one slice (the same turn)
        order, ran = [], asyncio.Event()

        async def record(group):
            order.extend(job.client for job in group)
            if len(order) == len(clients):
                ran.set()
        b._run_group = record
        for who, tokens in clients:
            b.submit(["x"], [], tokens, client=who)
        worker = asyncio.ensure_future(b.run())
        await asyncio.wait_for(ran.wait(), 5)
        worker.cancel()
        return "".join(order)

    burst = [("a", 100)] * 6
    assert asyncio.run(main(burst + [("b", 100), ("c", 300)])) == "abcaaaaa"
    assert asyncio.run(main(burst + [("b", 100)] * 3)) == "ababab" + "aaa"
    assert asyncio.run(main([("a", 100), ("a", 500), ("a", 50)])) == "aaa"  # one client: arrival order
