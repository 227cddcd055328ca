"""Where a step's head work should run when llama.cpp's threads use every core: beside the decode or after it.

One prompt generated in one process by the torch-free predictor (GgufPredictor.generate, greedy, --new tokens)
with the heads of benchmarks/llm_server.py's run folders (the guard read at every step, every head asked at the
end; or every head asked at the end only), against the same generation without heads; LlamaCpp.overlap set on
(beside) and off (after) in turn, the order alternating, medians over --repeats of the ratio heads / no heads.

    python benchmarks/llm_server.py train-heads --pip-libs --base gemma3-270m --heads-dir runs/llm_server_top17 \\
        --set mixer.max_layer=17
    python benchmarks/heads_overlap.py --base gemma3-270m --heads-dir runs/llm_server_top17 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT / "src"))

HEADS = ("cola", "sst5", "conll2003", "sst2")  # llm_server.py's, the last one the guard
PROMPT = "The history of the city begins in the twelfth century, when a small market"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--heads-dir", type=Path, default=Path("runs/llm_server_top17"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    from adalayers.infer.gguf_serving import GgufPredictor

    heads = [f"{n}={args.heads_dir / args.base / n / 'candidates' / 'head'}" for n in HEADS]
    with_heads = GgufPredictor.load(args.base, heads, threads=args.threads)
    alone = GgufPredictor.load(args.base, [], threads=args.threads)
    engine = with_heads.runtime.engine
    asked = {"guard at every step": dict(tasks=list(HEADS), guard={HEADS[-1]: ("positive", 1.0)}),
             "heads at the end only": dict(tasks=list(HEADS))}

    def seconds(predictor, kw) -> float:
        t0 = time.perf_counter()
        predictor.generate([PROMPT], max_new_tokens=args.new, ignore_eos=True, **kw)
        return time.perf_counter() - t0

    ratios: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        for overlap in (True, False) if rep % 2 == 0 else (False, True):
            engine.overlap = overlap
            for name, kw in asked.items():
                ratios.setdefault(f"{name}, {'beside' if overlap else 'after'}", []).append(
                    seconds(with_heads, kw) / seconds(alone, {}))
    print(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()},
                      "cores": engine.cores, "medians": {k: round(statistics.median(v), 3) for k, v in ratios.items()},
                      "ratios": {k: [round(x, 3) for x in v] for k, v in ratios.items()}}, indent=1))


if __name__ == "__main__":
    main()
