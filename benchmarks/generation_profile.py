"""Where the heads' time goes during generation: a per-operator profile (torch.profiler) of SideTasks.generate
with and without heads, in CPU microseconds per decode step.

    nice -n 10 python benchmarks/generation_profile.py --base gemma3-270m --batch 1 --new 24 --heads 4

First, paired decode steps (`--paired` repeats): one decode step after the prompts' prefill, run from a copy
of the same KV cache alone, with the heads tapping it, and as the heads' last step (the step that feeds them
the last generated token: no row needs logits), in rotating order; medians of each one's process CPU time
(microseconds) and of the paired differences: what the heads add to one step, free of the drift between
whole generations. On code without the last step's shortcut, that step is a full step with the heads.

Then each configuration (generate alone, then with the heads) runs once to warm up and once under the profiler;
the table lists, per operator, the self CPU time of the whole call (prefill, `new` steps, the step that
feeds the heads the last token, the heads' reads) divided by `new`, for both, and their difference: the
operators the heads add. Heads as in benchmarks/generation_overhead.py (configs/cola.yaml, every layer
used). One torch thread. The code profiled is this checkout's src/, or the one PYTHONPATH names.
"""
from __future__ import annotations

import argparse
import copy
import inspect
import json
import os
import statistics
import time
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from generation_overhead import PROMPTS, heads_for  # noqa: E402
from adalayers.infer.sidetasks import SideTasks  # noqa: E402
from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.store.run import write_json  # noqa: E402


def per_op(side: SideTasks, prompts: list[str], new: int, tasks: list[str], steps: bool) -> dict[str, tuple]:
    """{operator: (self CPU microseconds per decode step, calls per step)} of one profiled generate call."""
    side.generate(prompts, new, tasks, steps=steps, ignore_eos=True)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        side.generate(prompts, new, tasks, steps=steps, ignore_eos=True)
    return {e.key: (e.self_cpu_time_total / new, e.count / new) for e in prof.key_averages()}


def paired_steps(side: SideTasks, prompts: list[str], names: list[str], repeats: int) -> dict:
    """Medians (CPU microseconds) of one decode step alone, with the heads, and as the heads' last step."""
    decoder, heads = side.runtime.decoder(), [side.heads[n] for n in names]
    enc = side.backbone.tokenizer(prompts, padding=True, return_tensors="pt")
    (logits, cache), _ = side.tapped([], lambda tap: decoder.prefill(enc["input_ids"], enc["attention_mask"], tap))
    nxt, attn = logits.argmax(-1)[:, None], torch.cat([enc["attention_mask"], torch.ones_like(nxt)], 1)
    skips = "logits_for" in inspect.signature(decoder.step).parameters
    last_kw = {"logits_for": [], "stop_after": side.backbone.num_layers - 1} if skips else {}
    kinds = {"alone": ([], {}), "heads": (heads, {}), "heads_last_step": (heads, last_kw)}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    order = list(kinds)
    for _ in range(repeats + 1):  # the first round warms up
        order = order[1:] + order[:1]
        for kind in order:
            tapping, kw = kinds[kind]
            mine = copy.deepcopy(cache)
            c0 = time.process_time()
            side.tapped(tapping, lambda tap: decoder.step(nxt, attn, mine, tap, **kw))
            times[kind].append((time.process_time() - c0) * 1e6)
    times = {k: v[1:] for k, v in times.items()}
    out = {f"{k}_us": round(statistics.median(v)) for k, v in times.items()}
    for k in ("heads", "heads_last_step"):
        out[f"{k}_added_us"] = round(statistics.median(a - b for a, b in zip(times[k], times["alone"])))
    return {**out, "last_step_skips_lm_head": skips}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", action="store_true", help="the heads' per-step values too")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--paired", type=int, default=30, help="repeats of the paired decode steps")
    ap.add_argument("--out", default="benchmarks/results/generation_profile.json")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    backbone = Backbone.load(args.base)
    side = SideTasks(backbone, heads_for(backbone, args.heads), primary=False, max_length=64)
    prompts, names = PROMPTS[:args.batch], [f"head{i}" for i in range(args.heads)]
    paired = paired_steps(side, prompts, names, args.paired)
    print("one decode step, CPU us (medians):", json.dumps(paired), flush=True)
    alone = per_op(side, prompts, args.new, [], False)
    heads = per_op(side, prompts, args.new, names, args.steps)
    rows = sorted(set(alone) | set(heads), key=lambda k: -abs(heads.get(k, (0, 0))[0] - alone.get(k, (0, 0))[0]))
    table = [{"op": k, "alone_us": round(alone.get(k, (0, 0))[0]), "heads_us": round(heads.get(k, (0, 0))[0]),
              "added_us": round(heads.get(k, (0, 0))[0] - alone.get(k, (0, 0))[0]),
              "alone_calls": round(alone.get(k, (0, 0))[1], 1), "heads_calls": round(heads.get(k, (0, 0))[1], 1)}
             for k in rows]
    total = {"alone_us": round(sum(v[0] for v in alone.values())), "heads_us": round(sum(v[0] for v in heads.values()))}
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    write_json(Path(args.out), {"settings": {**settings, "torch": torch.__version__, "threads": 1,
                                             "code": "PYTHONPATH" if os.environ.get("PYTHONPATH") else "this checkout's src",
                                             "unit": "self CPU microseconds per decode step"},
                                "paired_step": paired, "total": total, "ops": table})
    print(f"per decode step, self CPU us: alone {total['alone_us']}, with {args.heads} heads {total['heads_us']} "
          f"(+{total['heads_us'] - total['alone_us']})")
    print(f"| operator | alone | with heads | added | calls alone / with heads |\n|---|---|---|---|---|")
    for r in table[:args.top]:
        print(f"| {r['op']} | {r['alone_us']} | {r['heads_us']} | {r['added_us']:+d} | "
              f"{r['alone_calls']} / {r['heads_calls']} |")
    print(json.dumps(total))


if __name__ == "__main__":
    main()
