"""The service's Prometheus metrics: one registry per app (never prometheus_client's global one), read by
GET /metrics (serve/routers/metrics.py) in Prometheus' text format.

    metrics = Metrics()                       # ServeState.metrics
    metrics.request("/v1/completions", 200)   # the /metrics router's middleware counts every answer
    decode = metrics.watching(decode)         # generations: prompt and generated tokens, TTFT, inter-token
    stops = metrics.counter("guard_stops", "Generations a guard stopped", ["head"])   # a new counter
    stops.labels(head="policy").inc()

Names follow vLLM's (vllm:...) where the concept is the same, under the adalayers: prefix (llama-server's
llamacpp:... in the help text), so dashboards made for those servers need only the prefix changed:

    adalayers:requests_total{route,status}            HTTP answers (every route, the route's template path)
    adalayers:prompt_tokens_total                     vllm:prompt_tokens_total, llamacpp:prompt_tokens_total
    adalayers:generation_tokens_total                 vllm:generation_tokens_total, llamacpp:tokens_predicted_total
    adalayers:time_to_first_token_seconds             vllm:time_to_first_token_seconds (histogram)
    adalayers:inter_token_latency_seconds             vllm:inter_token_latency_seconds (histogram)
    adalayers:e2e_request_latency_seconds             vllm:e2e_request_latency_seconds (generations; histogram)
    adalayers:num_requests_running                    vllm:num_requests_running, llamacpp:requests_processing
    adalayers:num_requests_waiting                    vllm:num_requests_waiting, llamacpp:requests_deferred
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "adalayers:"
# vLLM's buckets for the time to first token and between tokens (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)


class Metrics:
    """The service's counters, histograms and gauges, in a registry of its own."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self._requests = self.counter("requests", "HTTP requests answered, by route (its template path) and status "
                                                  "code", ["route", "status"])
        self._prompt_tokens = self.counter("prompt_tokens", "Prompt tokens of the generations prefilled "
                                                            "(vllm:prompt_tokens_total, llamacpp:prompt_tokens_total)")
        self._generation_tokens = self.counter("generation_tokens", "Tokens generated (vllm:generation_tokens_total, "
                                                                    "llamacpp:tokens_predicted_total)")
        self._ttft = Histogram(PREFIX + "time_to_first_token_seconds", "From the generation's start (its request "
                               "admitted) to its first generated token", buckets=TTFT_BUCKETS, registry=self.registry)
        self._itl = Histogram(PREFIX + "inter_token_latency_seconds", "Between two tokens of one generation",
                              buckets=ITL_BUCKETS, registry=self.registry)
        self._e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "From a generation's start to its end",
                              buckets=E2E_BUCKETS, registry=self.registry)
        self._running = Gauge(PREFIX + "num_requests_running", "Generations running (vllm:num_requests_running, "
                              "llamacpp:requests_processing)", registry=self.registry)
        self._waiting = Gauge(PREFIX + "num_requests_waiting", "Requests queued, not yet running: prediction and "
                              "generation (vllm:num_requests_waiting, llamacpp:requests_deferred)",
                              registry=self.registry)

    def counter(self, name: str, documentation: str, labels: Iterable[str] = ()) -> Counter:
        """A new counter adalayers:NAME_total in this registry (how other parts of the service add theirs)."""
        return Counter(PREFIX + name, documentation, list(labels), registry=self.registry)

    def request(self, route: str, status: int) -> None:
        """One HTTP answer of `route` (a route's template path, so the label's values stay few)."""
        self._requests.labels(route=route, status=str(status)).inc()

    def count_waiting(self, waiting: Callable[[], float]) -> None:
        """num_requests_waiting is read from `waiting()` at each scrape."""
        self._waiting.set_function(waiting)

    def watching(self, decode: Callable) -> Callable:
        """`decode` (ServeState.decode: prompts, params, route, request_id -> a generation's events) with every generation it
        starts measured (Watched)."""
        def watched(prompts, params, **kw):
            return Watched(decode(prompts, params, **kw), self)
        return watched

    def exposition(self) -> bytes:
        """Every metric in Prometheus' text format (version 0.0.4)."""
        return generate_latest(self.registry)


class Watched:
    """A generation's events (infer/generate.Stream: next, close, cancel), passed through unchanged while they
    are measured: prompt tokens at the "prompt" event, a generated token per row of each "step" event, the first
    step's time since the start and the time between steps; running until "done", close() or a failure."""

    def __init__(self, events, metrics: Metrics):
        self.events, self.metrics = events, metrics
        self.started = self.last = time.perf_counter()
        self.first = True
        self._ended, self._lock = False, threading.Lock()
        metrics._running.inc()

    def __iter__(self) -> "Watched":
        return self

    def __next__(self) -> dict:
        try:
            event = next(self.events)
        except BaseException:
            self._end(False)
            raise
        now, m = time.perf_counter(), self.metrics
        kind = event.get("event")
        if kind == "prompt":
            m._prompt_tokens.inc(sum(len(ids) for ids in event.get("token_ids", [])))
        elif kind == "step":
            m._generation_tokens.inc(sum(t is not None for t in event.get("ids", [])))
            (m._ttft if self.first else m._itl).observe(now - (self.started if self.first else self.last))
            self.first, self.last = False, now
        elif kind == "done":
            self._end(True)
        return event

    def close(self) -> None:
        try:
            self.events.close()
        finally:
            self._end(False)

    def cancel(self, why: str = "the generation was cancelled") -> None:
        self.events.cancel(why)

    def _end(self, done: bool) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self.metrics._running.dec()
        if done:
            self.metrics._e2e.observe(time.perf_counter() - self.started)
