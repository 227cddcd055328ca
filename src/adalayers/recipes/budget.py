"""Time before training: what one pass of the base costs, the cache built before the first epoch, and a time
budget (train.time_budget) turned into settings.

    pass_rate        the base timed on a trial batch of training rows: seconds per token (a second run of
                     the same batch, so the first call's warm-up does not count)
    build_cache      the cache entries still missing, their estimated build time printed, then built before
                     the first epoch: the epochs' times (and the time left printed after each) are the
                     head's alone
    apply_budget     train.time_budget minutes for the whole run: when the base's pass over every split
                     would take more than BUILD_SHARE of it, model.max_length is lowered until it fits (the
                     longer texts truncated, and said); the head then gets what is left, less a reserve for
                     the probes and the evaluation, as train.max_minutes (an epoch that would end past it is
                     not started); both choices are logged
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

log = logging.getLogger(__name__)

TRIAL_ROWS = 8
BUILD_SHARE = 0.5       # of the time budget, at most, for the base's pass over every split
AFTER_SHARE = 0.1       # of the time budget kept for the probes, the evaluation and writing the run


def minutes(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def tokens(split) -> int:
    return int(sum(len(r["input_ids"]) for r in split.rows))


def pass_rate(backbone, split, pad_id: int, seed: int = 0) -> float:
    """Seconds per token of the base's full pass, timed on TRIAL_ROWS training rows drawn with `seed`."""
    from adalayers.data.encoding import split_batch

    n = len(split.rows)
    rows = sorted(np.random.default_rng(seed).choice(n, min(TRIAL_ROWS, n), replace=False).tolist())
    batch = split_batch(split, rows, pad_id)
    took = []
    with torch.no_grad():
        for _ in range(2):
            t0 = time.perf_counter()
            backbone(batch, taps=[], stop_after=backbone.num_layers - 1)
            took.append(time.perf_counter() - t0)
    return took[-1] / max(int(batch["attention_mask"].sum()), 1)


def missing_entries(source, encoded: dict) -> list[str]:
    """The splits whose cache entries `source` has yet to build (every split when it is the live base: its
    epochs pass the base every time)."""
    if not hasattr(source, "entry_if_built"):
        return list(encoded)
    missing = []
    for name in encoded:
        try:
            source.entry_if_built(name)
        except FileNotFoundError:
            missing.append(name)
    return missing


def build_cache(source, encoded: dict, backbone, pad_id: int, seed: int) -> float:
    """Build the cache entries `source` still lacks, after printing their estimated build time; returns the
    seconds the build took (0 when every entry was there)."""
    missing = missing_entries(source, encoded)
    if not missing:
        return 0.0
    todo = sum(tokens(encoded[n]) for n in missing)
    rate = pass_rate(backbone, encoded["train"], pad_id, seed)
    log.info("cache: building %s (%s tokens) before the first epoch: about %s at the %.0f tokens/s the base "
             "ran a trial batch of %d training rows at", ", ".join(missing), f"{todo:,}", minutes(todo * rate),
             1 / rate, TRIAL_ROWS)
    t0 = time.perf_counter()
    for name in missing:
        source.entry(name)
    took = time.perf_counter() - t0
    log.info("cache: built in %s (estimated %s)", minutes(took), minutes(todo * rate))
    return took


def length_for(lengths: np.ndarray, max_tokens: float) -> int:
    """The largest cut L such that sum(min(length, L)) <= max_tokens (at least 8)."""
    lo, hi = 8, int(lengths.max()) if lengths.size else 8
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if np.minimum(lengths, mid).sum() <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


def apply_budget(cfg, backbone, data, encoded: dict, started: float, reencode, missing: list[str]) -> dict:
    """train.time_budget: lower model.max_length when the base's pass over the splits still to cache (`missing`)
    would take over BUILD_SHARE of the budget (re-encoding with `reencode(cfg)`: every split is then new to
    the cache), then set train.max_minutes to what is left for the head. `started`: time.perf_counter() when
    the run began. Returns the (maybe re-encoded) splits."""
    budget = cfg.train.time_budget * 60
    pad_id = backbone.tokenizer.pad_token_id or 0
    rate = pass_rate(backbone, encoded["train"], pad_id, cfg.train.seed) if missing else 0.0
    total = sum(tokens(encoded[n]) for n in missing)
    if total * rate > BUILD_SHARE * budget:
        lengths = np.array([len(r["input_ids"]) for n in missing for r in encoded[n].rows])
        old = cfg.model.max_length
        cfg.model.max_length = min(old, length_for(lengths, BUILD_SHARE * budget / rate))
        encoded = reencode(cfg)
        cut = float((lengths > cfg.model.max_length).mean())
        log.info("time budget %s: the base's pass over %s tokens would take about %s (%.0f tokens/s), over "
                 "%d%% of it: model.max_length %d (not %s), %.1f%% of the texts truncated", minutes(budget),
                 f"{total:,}", minutes(total * rate), 1 / rate, round(100 * BUILD_SHARE), cfg.model.max_length,
                 old, 100 * cut)
        total = sum(tokens(s) for s in encoded.values())
    spent = time.perf_counter() - started
    head = budget - spent - total * rate - AFTER_SHARE * budget
    cfg.train.max_minutes = round(max(head, 60.0) / 60, 2)
    log.info("time budget %s: %s spent loading, about %s for the base's pass (the cache), %s kept for the probes "
             "and the evaluation: the head trains for at most train.max_minutes=%g (of max_epochs %d; an epoch "
             "that would end past it is not started)", minutes(budget), minutes(spent), minutes(total * rate),
             minutes(AFTER_SHARE * budget), cfg.train.max_minutes, cfg.train.max_epochs)
    return encoded
