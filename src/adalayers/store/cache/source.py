"""Hidden states from the on-disk cache, with the same `run(batch, tasks)` as states.LiveStates.

The key of a split's entry is everything its hidden states depend on: the base's fingerprint,
the tokenizer, max_length, encoder/decoder states, the sha256 of the dataset files, the split
name and a hash of the split's token ids (and the runtime, when it is not torch: llama.cpp runs a
GGUF base quantized, so its states differ from torch's under the same fingerprint). A split's entry is built the first time one of its
batches arrives: one pass of the base over the split, shard by shard, each shard in length order
(less padding than a shuffled epoch), every layer written. Later batches read only the layers some
task uses, streaming shard by shard from memory-mapped files, so a cache larger than RAM trains.
`adalayers cache build` can split the pass across processes (build_part).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from adalayers.data.encoding import EncodedSplit, split_batch
from adalayers.engine.progress import bar
from adalayers.files import cache_root, sha256
from adalayers.model.states import LiveStates
from adalayers.data.templates import Template
from adalayers.model.precision import autocast_for, precision_of
from adalayers.store.cache.store import (CacheDamaged, CacheError, Writer, assemble_parts, incomplete_build, key_of, locked,
                                   open_entry)

BYTES_PER_VALUE = 2  # float16
FP16_MAX = 65504.0


def to_fp16(h: torch.Tensor) -> torch.Tensor:
    """Hidden states as stored: float16 on the CPU, clamped to its range (+-65504).

    Real tokens stay far inside it, but a decoder's BOS state can leave it (Gemma 3: norm ~1e5):
    stored as inf, it would turn into NaN gradients for every head even where the BOS is masked.
    """
    return h.to("cpu").clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
log = logging.getLogger(__name__)


def cache_dir(cfg=None) -> Path:
    """Where entries live: cache.dir, else $ADALAYERS_CACHE, else ~/.cache/adalayers; states/ inside it."""
    base = Path(cfg.cache.dir).expanduser() if cfg is not None and cfg.cache.dir else cache_root()
    return base / "states"


def tokenizer_hash(tokenizer) -> str:
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    h.update(text.encode())
    h.update(json.dumps([str(tokenizer.special_tokens_map), getattr(tokenizer, "truncation_side", "")]).encode())
    return h.hexdigest()[:16]


def rows_hash(split: EncodedSplit) -> str:
    h = hashlib.sha256()
    h.update(np.array([len(r["input_ids"]) for r in split.rows], dtype=np.int64).tobytes())
    for field in ("input_ids", "token_type_ids"):
        if split.rows and field in split.rows[0]:
            h.update(np.concatenate([np.asarray(r[field], dtype=np.int64) for r in split.rows]).tobytes())
    return h.hexdigest()[:16]


def split_fields(cfg, backbone, data, split: EncodedSplit, files_hash: dict) -> dict:
    fields = {"fingerprint": backbone.fingerprint(), "tokenizer": tokenizer_hash(backbone.tokenizer),
              "max_length": cfg.model.max_length, "states": cfg.model.states, "data": files_hash,
              "split": split.name, "rows": rows_hash(split)}
    template = Template.of(cfg).key()
    if template:  # the rows hash changes with the wrapped text too; entries without a template keep their keys
        fields["template"] = template
    precision = precision_of(cfg.train.precision, backbone.device)
    if precision != "fp32":  # fp32 entries keep the keys they had before precision was part of the key
        fields["precision"] = precision
    runtime = getattr(backbone, "runtime_name", "torch")
    if runtime != "torch":  # llama.cpp runs the GGUF quantized: other states under the same fingerprint
        fields["runtime"] = runtime
    return fields


def _lengths(split: EncodedSplit) -> np.ndarray:
    return np.array([len(r["input_ids"]) for r in split.rows], dtype=np.int64)


class CachedStates:
    """Reads hidden states of known splits from the cache (building an entry on first use).

    Batches without a known split, or that need the base's own output (`primary`), run live.
    """

    def __init__(self, cfg, backbone, data, encoded: dict, root: Path, keys: dict, fields: dict):
        self.cfg, self.backbone, self.data, self.encoded = cfg, backbone, data, encoded
        self.root, self.keys, self.fields = root, keys, fields
        self.live = LiveStates(backbone)
        self.entries: dict = {}
        self.pad_id = backbone.tokenizer.pad_token_id or 0

    # --- serving -------------------------------------------------------------------------------
    def run(self, batch: dict, tasks, primary: bool = False):
        split = batch.get("split")
        if primary or split not in self.keys or "index" not in batch:
            return self.live.run(batch, tasks, primary)
        rows = batch["index"].cpu().numpy()
        layers = sorted(set().union(*(t.used_layers() for t in tasks)))
        entry, plan = self._checked(split, rows, layers)
        mask = batch["attention_mask"]
        if not np.array_equal(plan.lengths, mask.sum(1).cpu().numpy()):
            raise CacheError(f"batch of split {split!r} does not match the cached rows {self.keys[split]} "
                             f"(token counts differ); was the split re-encoded after the cache was opened?")
        # Heads that accept packed tokens get only the real ones: no work on padding.
        packed = all(getattr(t, "packed_ok", False) for t in tasks)
        shape = (int(plan.lengths.sum()),) if packed else tuple(mask.shape)
        for t in tasks:
            t.begin()
        for i in layers:
            z = (torch.empty if packed else torch.zeros)((*shape, entry.hidden), device=self.backbone.device)
            entry.read(plan, i, z)
            for t in tasks:
                t.tap(i, z)
        return None

    def _checked(self, split: str, rows: np.ndarray, layers: list[int]):
        """The entry and the batch's plan, once every file the batch needs is mapped and checksummed."""
        for attempt in (1, 2):
            entry = self.entry(split)
            plan = entry.layout.plan(rows)
            try:
                for shard, *_ in plan.parts:
                    for i in layers:
                        entry.array(shard, i)
                return entry, plan
            except CacheDamaged as e:
                if attempt == 2:
                    raise CacheError(f"cache entry {entry.folder} is still damaged after rebuilding it: {e}") from None
                self.rebuild(split, str(e), entry.manifest.get("build"))

    # --- entries -------------------------------------------------------------------------------
    def entry(self, split: str):
        """The opened entry of a split, built (under the key's lock) when missing or damaged.

        A sharded build that is missing parts is refused: its other processes may still be running,
        or may have failed; either way this process does not guess (the message says what to run).
        """
        if split not in self.entries:
            try:
                self.entries[split] = open_entry(self.root, self.keys[split], self.fields[split])
            except FileNotFoundError:
                self._refuse_incomplete(split)
                self.entries[split] = self._build(split)
            except CacheDamaged as e:
                self.rebuild(split, str(e))
        return self.entries[split]

    def _refuse_incomplete(self, split: str) -> None:
        problem = incomplete_build(self.root, self.keys[split])
        if problem:
            raise CacheError(f"{self.data.name}/{split}: {problem}")

    def rebuild(self, split: str, reason: str, bad_build: str | None = None):
        """Replace a damaged entry (unless another process already has: then use theirs)."""
        log.warning("cache: entry %s (%s/%s) is damaged: %s; rebuilding", self.keys[split], self.data.name, split,
                    reason)
        self.entries[split] = self._build(split, bad_build)
        return self.entries[split]

    def _writer(self, split: str, part: tuple[int, int] | None = None) -> Writer:
        bb, enc = self.backbone, self.encoded[split]
        info = {"task": self.data.name, "split": split, "base": bb.name, "max_length": self.cfg.model.max_length}
        return Writer(self.root, self.keys[split], self.fields[split], info, _lengths(enc), bb.num_layers,
                      bb.hidden_size, self.cfg.cache.shard_mb, part)

    def _fill(self, split: str, writer: Writer) -> None:
        """Run the base over the writer's shards, one shard at a time, each in length order (less padding).

        A shard's batches are the same whichever process builds it, so a build split across
        processes writes the very bytes one process would.
        """
        enc, bb = self.encoded[split], self.backbone
        autocast = autocast_for(self.cfg.train.precision, bb.device)
        bs = self.cfg.train.eval_batch_size
        plan = []
        for s in writer.own:
            a, b = writer.layout.shards[s]
            rows = sorted(range(a, b), key=lambda i: len(enc.rows[i]["input_ids"]))
            plan += [rows[j: j + bs] for j in range(0, len(rows), bs)]
        part = f" (part {writer.part[0]}/{writer.part[1]})" if writer.part else ""
        for idx in bar(plan, len(plan), f"caching {self.data.name}/{split}{part}"):
            batch = split_batch(enc, idx, self.pad_id)
            rows_plan = writer.layout.plan(batch["index"].numpy())
            keep = batch["attention_mask"].bool().to(bb.device)

            def tap(i, h):
                writer.write(rows_plan, i, to_fp16(h[keep]).numpy())

            with autocast() if autocast else contextlib.nullcontext():  # the precision in the key
                bb(batch, taps=[tap], stop_after=bb.num_layers - 1)

    def _build(self, split: str, bad_build: str | None = None):
        key, fields = self.keys[split], self.fields[split]
        with locked(self.root, key):
            try:  # another process may have built it while we waited for the lock
                entry = open_entry(self.root, key, fields)
                if bad_build is None or entry.manifest.get("build") != bad_build:
                    return entry
            except (FileNotFoundError, CacheDamaged):
                pass
            writer = self._writer(split)
            try:
                self._fill(split, writer)
                writer.commit()
            except BaseException:
                writer.abort()
                raise
            return open_entry(self.root, key, fields)

    def build_part(self, split: str, part: int, parts: int):
        """Process `part` of `parts` builds its shards of a split; returns the entry once every part is
        in (this process or another wrote the manifest), else None."""
        key, fields = self.keys[split], self.fields[split]
        try:
            return self.entry_if_built(split)
        except FileNotFoundError:
            pass
        writer = self._writer(split, (part, parts))
        try:
            self._fill(split, writer)
            writer.commit_part()
        except BaseException:
            writer.abort()
            raise
        with locked(self.root, key):
            try:
                return self.entry_if_built(split)
            except FileNotFoundError:
                pass
            if assemble_parts(self.root, key, fields, parts) is None:
                return None
            return self.entry_if_built(split)

    def entry_if_built(self, split: str):
        """The finished entry of a split (FileNotFoundError when there is none yet)."""
        if split not in self.entries:
            self.entries[split] = open_entry(self.root, self.keys[split], self.fields[split])
        return self.entries[split]


def estimate_bytes(encoded: dict, num_layers: int, hidden: int) -> int:
    tokens = sum(int(_lengths(s).sum()) for s in encoded.values())
    return tokens * num_layers * hidden * BYTES_PER_VALUE


_FILE_HASHES: dict = {}


def files_hash(files) -> dict:
    """sha256 of each dataset file, by name (remembered per path, size and mtime within a process)."""
    out = {}
    for f in files:
        f = Path(f)
        st = f.stat()
        memo = (str(f.resolve()), st.st_size, st.st_mtime_ns)
        if memo not in _FILE_HASHES:
            _FILE_HASHES[memo] = sha256(f)
        out[f.name] = _FILE_HASHES[memo]
    return out


def usable_folder(root: Path) -> bool:
    """True when `root` is (or can be made) a writable folder. A read-only or uncreatable one: a one-line
    warning and False (the base then runs live). A path through a file: a CacheError naming it."""
    for p in (root, *root.parents):
        if p.exists():
            if not p.is_dir():
                raise CacheError(f"cache folder {root}: {p} is a file, not a folder (check ADALAYERS_CACHE or "
                                 f"cache.dir)")
            break
    try:
        root.mkdir(parents=True, exist_ok=True)
        writable = os.access(root, os.W_OK | os.X_OK)
        reason = "is not writable"
    except OSError as e:
        writable, reason = False, f"cannot be created ({e.strerror or e})"
    if not writable:
        log.warning(f"cache: {root} {reason}; running the base on the fly every epoch instead")
    return writable


def cached_source(cfg, backbone, data, encoded: dict) -> CachedStates | None:
    """A CachedStates for these splits, or None (after saying why) when the cache does not fit."""
    root = cache_dir(cfg)
    if not data.files:
        log.info("cache: task %s names no data files to key the cache on; running the base on the fly", data.name)
        return None
    fh = files_hash(data.files)
    fields = {name: split_fields(cfg, backbone, data, split, fh) for name, split in encoded.items()}
    keys = {name: key_of(f) for name, f in fields.items()}
    size = estimate_bytes(encoded, backbone.num_layers, backbone.hidden_size)
    missing = sum(estimate_bytes({n: s}, backbone.num_layers, backbone.hidden_size)
                  for n, s in encoded.items() if not (root / keys[n] / "manifest.json").is_file())
    tokens = sum(int(_lengths(s).sum()) for s in encoded.values())
    log.info(f"cache: {data.name} hidden states: {tokens:,} tokens x {backbone.num_layers} layers x "
             f"{backbone.hidden_size} fp16 = {size / 1e9:.3f} GB ({missing / 1e9:.3f} GB still to build) in {root}")
    if size > cfg.cache.max_gb * 1e9:
        log.warning(f"cache: {size / 1e9:.3f} GB is over cache.max_gb={cfg.cache.max_gb:g}; running the base on the "
                    f"fly every epoch instead (raise cache.max_gb to cache it)")
        return None
    if not usable_folder(root):
        return None
    free = shutil.disk_usage(root).free
    if missing > free:
        log.warning(f"cache: {missing / 1e9:.3f} GB to build but only {free / 1e9:.3f} GB free in {root}; running "
                    f"the base on the fly every epoch instead")
        return None
    return CachedStates(cfg, backbone, data, encoded, root, keys, fields)
