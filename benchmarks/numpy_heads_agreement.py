"""The numpy heads against the torch heads on llama.cpp's states of real text: the same head (weights), the same
states, both evaluations. CoLA test sentences (GLUE dev) through a sequence head of configs/cola.yaml's shape,
CoNLL-2003 test sentences (words joined by spaces) through a token head of configs/conll.yaml's shape.

The heads here are not trained (seeded initial weights, random layer weights under the cutoff): their
probabilities sit near 0.5, where a label flips most easily, so label agreement is a harder test than on a
trained head. Reported: the share of equal labels (tags per token the head sees), the largest probability
difference.

    nice python benchmarks/numpy_heads_agreement.py --base gemma3-270m --sentences 0   # 0: every test sentence
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT / "src"))


def texts(task: str, n: int) -> list[str]:
    from adalayers.config import Config
    from adalayers.data.tasks import load_task

    cfg = Config()
    cfg.task.name = task
    split = load_task(cfg).splits["test"]
    split = split[:n] if n else split
    return [" ".join(e.words) if e.words is not None else e.text for e in split]


def head(config: str, kind: str, labels: list[str], L: int, d: int, bos: bool, seed: int):
    from adalayers import config as config_mod
    from adalayers.infer.numpy_runs import task_from_state
    from adalayers.model.sidetask import SideTask

    cfg = config_mod.load(ROOT / "configs" / config)
    cfg.head.kind = kind
    torch.manual_seed(seed)
    task = SideTask(cfg, L, d, labels, bos=bos).eval()
    with torch.no_grad():
        task.mixer.p.copy_(1 + torch.randn(L) * 0.02)
    mine = task_from_state(cfg, labels, {n: p.detach().numpy() for n, p in task.named_parameters()}, task.skip_bos, L, d)
    return task, mine


def compare(engine, tok, sentences: list[str], task, mine) -> dict:
    from adalayers.infer import numpy_heads as nh
    from adalayers.infer.layer_mix import LayerMix
    from adalayers.infer.llamacpp import Row

    same = total = 0
    worst = 0.0
    wanted = set(mine.used_layers())
    for s in sentences:
        ids = tok.encode(s)
        seq = engine.acquire(1)
        states = {}
        engine.decode([Row(ids, seq[0])], [lambda i, z: states.__setitem__(i, z)], wanted=wanted, outputs="all",
                      stop_after=max(wanted))
        engine.release(seq)
        mask = np.ones((1, len(ids)), bool)
        mix = LayerMix([mine])
        mix.begin(len(ids))
        for i in sorted(states):
            mix.add(i, states[i])
        got = nh.probabilities(mine, mine.read(mix.take()[0][None], mask))
        with torch.no_grad():
            task.begin()
            for i in sorted(states):
                task.tap(i, torch.from_numpy(states[i])[None])
            want = torch.softmax(task.read(task.take(), torch.from_numpy(mask)), -1).numpy()
        if got.ndim == 3:  # tokens: the ones the head sees
            seen = mine.seen(mask)
            got, want = got[seen], want[seen]
        worst = max(worst, float(np.abs(got - want).max()))
        same += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += got.reshape(-1, got.shape[-1]).shape[0]
    return {"equal": round(same / total, 6), "compared": total, "max_probability_difference": worst}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--sentences", type=int, default=0, help="per task; 0: the whole test set")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/numpy_heads_agreement.json")
    args = ap.parse_args()
    from adalayers.infer.llamacpp import LlamaCpp, gguf_path
    from adalayers.infer.llamacpp_tokenizer import GgufTokenizer

    engine = LlamaCpp(gguf_path(args.base), n_ctx=1024, n_seq=2, n_batch=512, threads=args.threads)
    tok = GgufTokenizer(engine)
    L, d = engine.num_states, engine.d
    out = {"settings": vars(args)}
    task, mine = head("cola.yaml", "sequence", ["unacceptable", "acceptable"], L, d, tok.adds_bos, 0)
    out["cola"] = compare(engine, tok, texts("cola", args.sentences), task, mine)
    print("cola", out["cola"], flush=True)
    task, mine = head("conll.yaml", "token", [f"t{j}" for j in range(9)], L, d, tok.adds_bos, 1)
    out["conll2003"] = compare(engine, tok, texts("conll2003", args.sentences), task, mine)
    print("conll2003", out["conll2003"], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
