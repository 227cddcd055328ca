"""The torch-free serving path against the torch path on the same llama.cpp states (issue 53's agreement goal).

Both predictors load the same GGUF base and the same trained run folders, in one process (the reference needs
torch; the served path never imports it, which tests/test_llamacpp_serve.py checks):

    torch      SideTasks.load(base, heads, runtime="llama.cpp"): llama.cpp's states, torch heads, transformers'
               tokenizer read from the GGUF
    numpy      GgufPredictor.load(base, heads): llama.cpp's states, numpy heads, llama.cpp's own tokenizer

Every test text of the sequence head's task and of the token head's task is predicted by both (`predict`, as
/predict answers it). Reported per head: the share of equal labels (token heads: equal tags per word), the
largest difference of a probability (sequence heads; token heads: of a word's tag score), the texts compared.

    nice python benchmarks/gguf_serving_agreement.py --base gemma3-270m \
        --heads runs/llm_server/gemma3-270m/cola runs/llm_server/gemma3-270m/conll2003
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT / "src"))


def test_texts(run: Path, n: int) -> list[str]:
    """The test split of the task the run folder was trained on (words joined by spaces for token tasks)."""
    from adalayers.data.tasks import load_task
    from adalayers.store import run as runlib

    cfg = runlib.run_config(run)
    cfg.task.max_eval_examples = None  # the whole test split, whatever the head was evaluated on
    split = load_task(cfg).splits["test"]
    split = split[:n] if n else split
    return [" ".join(e.words) if e.words is not None else e.text for e in split]


def compare(a: list[dict], b: list[dict], name: str) -> dict:
    same = total = 0
    worst = 0.0
    for x, y in zip(a, b):
        x, y = x["tasks"][name], y["tasks"][name]
        if "tags" in x:
            same += sum(p == q for p, q in zip(x["tags"], y["tags"]))
            total += len(x["tags"])
            worst = max([worst] + [abs(p - q) for p, q in zip(x["scores"], y["scores"]) if p is not None])
        else:
            same += x["label"] == y["label"]
            total += 1
            worst = max([worst] + [abs(x["probabilities"][k] - y["probabilities"][k]) for k in x["probabilities"]])
    return {"equal": round(same / max(total, 1), 6), "compared": total, "max_probability_difference": round(worst, 6)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--heads", nargs="+", type=Path, required=True, help="trained run folders on the base")
    ap.add_argument("--texts", type=int, default=0, help="per head's task; 0: the whole test split")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/gguf_serving_agreement.json")
    args = ap.parse_args()
    from adalayers.infer.gguf_serving import GgufPredictor
    from adalayers.infer.sidetasks import SideTasks

    heads = [str(h) for h in args.heads]
    torch_side = SideTasks.load(args.base, heads, runtime="llama.cpp", threads=args.threads)
    numpy_side = GgufPredictor.load(args.base, heads, threads=args.threads)
    out = {"settings": {"base": args.base, "heads": heads, "texts": args.texts, "threads": args.threads,
                        "command": "benchmarks/gguf_serving_agreement.py " + " ".join(sys.argv[1:])},
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}, "heads": {}}
    for run in args.heads:
        name = run.name
        texts = test_texts(run, args.texts)
        t0 = time.perf_counter()
        a = torch_side.predict(texts, [name])
        t1 = time.perf_counter()
        b = numpy_side.predict(texts, [name])
        t2 = time.perf_counter()
        out["heads"][name] = {**compare(a, b, name), "texts": len(texts),
                              "seconds": {"torch": round(t1 - t0, 1), "numpy": round(t2 - t1, 1)}}
        print(name, out["heads"][name], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
