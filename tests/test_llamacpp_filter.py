"""The compiled node filter (adalayers.infer.llamacpp_filter) is cached on disk by numba: a second process loads
the cfunc instead of compiling it, and the loaded code calls the Python data path of its own process (the
callback's address is read from the table at call time, not frozen into the cached code).

No llama.cpp here: a fake tensor (a byte buffer with a name at NAME and the other fields at the offsets of LAYOUT).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba", reason="numba is not installed (pip install 'adalayers[llamacpp]')")

# one process: make a filter, ask it about three node names, hand it the wanted one, report what happened
SCRIPT = r"""
import ctypes, json
from adalayers.infer import llamacpp_filter as f

NAME, LAYOUT = 16, (16, 100, 140, 180)  # name, ne, nb, data offsets in the fake tensor


class Owner:
    seen = []

    def on_data(self, t):
        self.seen.append(ctypes.string_at(t + NAME).decode())
        return True


owner = Owner()
node_filter = f.NodeFilter([b"l_out-0", b"l_out-1"], LAYOUT, owner)
node_filter.set_answers([False, True])
call = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(node_filter.address)
answers = {}
for name in (b"l_out-0", b"l_out-1", b"result_norm"):
    node = ctypes.create_string_buffer(256)
    ctypes.memmove(ctypes.addressof(node) + NAME, name, len(name))
    answers[name.decode()] = call(ctypes.addressof(node), True, node_filter.user_data)
    if answers[name.decode()]:
        answers["data " + name.decode()] = call(ctypes.addressof(node), False, node_filter.user_data)
print(json.dumps({"cache_hits": f.compiled(LAYOUT).cache_hits, "answers": answers, "seen": owner.seen}))
"""


def _run(cache_dir: Path) -> dict:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir),
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_second_process_loads_the_filter_from_numbas_cache(tmp_path):
    expected = {"answers": {"l_out-0": False, "l_out-1": True, "data l_out-1": True, "result_norm": False},
                "seen": ["l_out-1"]}
    first = _run(tmp_path)
    assert first == {"cache_hits": 0, **expected}  # compiled, then saved
    assert any(tmp_path.rglob("*llamacpp_filter*.nbi")), sorted(p.name for p in tmp_path.rglob("*"))
    second = _run(tmp_path)
    assert second == {"cache_hits": 1, **expected}  # loaded, and it reaches this process's Python data path
