"""Run folders for tests: a freshly initialised SideTask saved the way training saves its best epoch."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import torch
import uvicorn

from adalayers.store import run as runlib
from adalayers.config import Config
from adalayers.model.sidetask import SideTask

NER = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
ROOT = Path(__file__).resolve().parents[1]


def make_run(run_dir: Path, backbone, kind: str, labels: list[str], seed: int, p: list[float] | None = None,
             max_length: int = 32, pairs: bool = False, template: str | None = None) -> Path:
    """p sets the layer logits (e.g. [1, 1, 0, 0] keeps layers 0-1 only: the rest fall under the cutoff).
    pairs: a head of a sentence-pair task (its config names task qqp). template: its task.template."""
    cfg = Config()
    if pairs:
        cfg.task.name = "qqp"
    cfg.task.template = template
    cfg.mixer.k, cfg.head.num_heads, cfg.head.dim_feedforward = 8, 2, 16
    cfg.head.kind, cfg.model.max_length, cfg.model.base = kind, max_length, backbone.name
    torch.manual_seed(seed)
    task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, labels)
    with torch.no_grad():
        if p is not None:
            task.mixer.p.copy_(torch.tensor(p, dtype=torch.float32))
        for param in task.head.parameters():  # larger weights: confident, varied predictions to compare
            param.mul_(3.0)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sha = runlib.save_head(run_dir, task)
    runlib.save_config(run_dir, cfg, labels, backbone, sha, task=run_dir.name, kind=kind)
    return run_dir


def tiny_llama(root: Path):
    """A tiny random Llama saved as a model folder ROOT/tiny-llama (a BOS-prepending tokenizer); -> (folder, its
    loaded Backbone)."""
    from adalayers.model.backbone import Backbone
    from tinydecoders import decoder_model, decoder_tokenizer

    tok = decoder_tokenizer(bos=True)
    decoder_model("llama", len(tok)).save_pretrained(root / "tiny-llama")
    tok.save_pretrained(root / "tiny-llama")
    return root / "tiny-llama", Backbone.load(str(root / "tiny-llama"))


@contextmanager
def serve_in_thread(app, log_level: str = "warning"):
    """The app under a real uvicorn server on a free loopback port, in a thread; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 20
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        assert server.started
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BLOCKED = """import runpy, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            print(f"blocked import: {{name}}", file=sys.stderr, flush=True)  # ServeProcess.blocked_imports
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
sys.meta_path.insert(0, Blocked())
sys.argv[0] = "adalayers"
runpy.run_module("adalayers.cli", run_name="__main__")
"""


class ServeProcess:
    """`adalayers serve --base BASE --heads HEADS... FLAGS` (no heads: no --heads) under uvicorn in a subprocess on a free loopback
    port (this checkout's src first on PYTHONPATH), its output in ROOT_DIR/server-PORT.log."""

    def __init__(self, base, heads: list, root: Path, *flags: str, without: tuple[str, ...] = ()):
        """`without`: packages the server's process cannot import (each import of them fails, as when they are
        not installed), e.g. ("torch", "transformers") for the torch-free llama.cpp path."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logfile = Path(root) / f"server-{self.port}.log"
        self.log = open(self.logfile, "w")
        start = [sys.executable, "-c", BLOCKED.format(names=tuple(without))] if without else [
            sys.executable, "-m", "adalayers.cli"]
        cmd = [*start, "serve", "--base", str(base),
               *(["--heads", *map(str, heads)] if heads else []), "--port", str(self.port), "--threads", "1", *flags]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_started(self) -> "ServeProcess":
        deadline = time.time() + 180
        while time.time() < deadline:
            assert self.proc.poll() is None, self.logfile.read_text()
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError("server did not start")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def blocked_imports(self) -> list[str]:
        """The imports of `without`'s packages the process tried so far (each refused, and maybe caught by an
        `except ImportError` that would hide it): what it would have imported where they are installed."""
        return [line.split(": ", 1)[1] for line in self.logfile.read_text().splitlines()
                if line.startswith("blocked import: ")]

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def assert_json_close(a, b, tol: float, path: str = "") -> None:
    """The same JSON: equal keys, lengths, strings and ints; floats within `tol` (absolute)."""
    import pytest

    assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, path
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_json_close(a[k], b[k], tol, f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_json_close(x, y, tol, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=tol), path
    else:
        assert a == b, path


@contextmanager
def tiny_gguf_runs(root: Path):
    """A tiny F32 GGUF base written under `root` (its conversion cached there) and two heads trained on its
    transformers states: {"root", "base" (the .gguf path), "acc" (sequence), "ner" (token)}."""
    import pytest

    from adalayers.model.backbone import Backbone
    from tinygguf import write_tiny_llama

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADALAYERS_CACHE", str(root / "cache"))
        gguf = write_tiny_llama(root / "tiny-llama.gguf")
        base = Backbone.load(str(gguf), "decoder")
        yield {"root": root, "base": gguf,
               "acc": make_run(root / "acc", base, "sequence", ["bad", "good"], seed=3, max_length=64),
               "ner": make_run(root / "ner", base, "token", NER, seed=4, max_length=64)}
