"""Where the heads' time goes in one decode step of generation: CPU microseconds, and a per-operator profile
(torch.profiler) of a step alone and with the heads.

    nice -n 10 python benchmarks/generation_profile.py --base gemma3-270m --batch 1 --heads 4

After the prompts' prefill, one decode step is run again and again from a copy of the same KV cache:
alone, with the heads tapping it, as the heads' last step (the step that feeds them the last generated
token: no row needs logits), and with layer hooks that do nothing, in rotating order (`--paired`
rounds, after one warm-up round). Reported: medians of each one's process CPU time and of the paired
differences (what the heads add to a step, free of the drift between whole generations). Then
`--profiled` pairs of steps (alone, with heads) run under torch.profiler, each in its own profile;
the table gives each operator's median self CPU time alone and with the heads, sorted by the
difference. Heads as in benchmarks/generation_overhead.py (configs/cola.yaml, every layer used).
One torch thread. On code without the last step's shortcut, that step is a full step with the
heads. The code profiled is this checkout's src/, or the one PYTHONPATH names.
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
from adalayers.infer.generate import read_heads  # noqa: E402
from adalayers.infer.sidetasks import SideTasks  # noqa: E402
from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.store.run import write_json  # noqa: E402


def paired_steps(side: SideTasks, prompts: list[str], names: list[str], repeats: int, profiled: int) -> tuple:
    """Medians (CPU microseconds) of one decode step alone, with the heads, and as the heads' last step; then
    {operator: (median self CPU us alone, with heads)} over `profiled` profiled pairs of steps."""
    decoder, heads = side.runtime.decoder(), [side.heads[n] for n in names]
    enc = side.backbone.tokenizer(prompts, padding=True, return_tensors="pt")
    (logits, cache), accs = side.tapped(heads, lambda tap: decoder.prefill(enc["input_ids"], enc["attention_mask"], tap))
    nxt = logits.argmax(-1)[:, None]
    attn = torch.cat([enc["attention_mask"], torch.ones_like(nxt)], 1)
    skips = "logits_for" in inspect.signature(decoder.step).parameters
    last_kw = {"logits_for": [], "stop_after": side.backbone.num_layers - 1} if skips else {}
    kinds = {"alone": ([], {}), "heads": (heads, {}), "heads_last_step": (heads, last_kw), "empty_hooks": ([], {}),
             "heads_values": (heads, {}), "heads_values_one_by_one": (heads, {})}

    def step(kind: str) -> None:
        tapping, kw = kinds[kind]
        mine = copy.deepcopy(cache)
        if kind == "empty_hooks":  # the layer hooks with a tap that does nothing: their own cost
            side.tapped([], lambda tap: decoder.step(nxt, attn, mine, lambda i, z: None))
            return
        _, new = side.tapped(tapping, lambda tap: decoder.step(nxt, attn, mine, tap, **kw))
        if kind.startswith("heads_values"):  # as Generation._step_values: every head on its whole F so far
            grown = {n: torch.cat([accs[n], new[n]], 1) for n in names}
            groups = [names] if kind == "heads_values" else [[n] for n in names]
            for g in groups:
                read_heads(side, g, [grown[n] for n in g], attn.bool())

    times: dict[str, list[float]] = {k: [] for k in kinds}
    order = list(kinds)
    for _ in range(repeats + 1):  # the first round warms up
        order = order[1:] + order[:1]
        for kind in order:
            c0 = time.process_time()
            step(kind)
            times[kind].append((time.process_time() - c0) * 1e6)
    times = {k: v[1:] for k, v in times.items()}
    out = {f"{k}_us": round(statistics.median(v)) for k, v in times.items()}
    for k in ("heads", "heads_last_step", "empty_hooks", "heads_values", "heads_values_one_by_one"):
        out[f"{k}_added_us"] = round(statistics.median(a - b for a, b in zip(times[k], times["alone"])))
    ops: dict[str, dict[str, list[float]]] = {}
    for r in range(profiled):
        for kind in (("alone", "heads") if r % 2 else ("heads", "alone")):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(kind)
            for e in prof.key_averages():
                ops.setdefault(e.key, {"alone": [0.0] * profiled, "heads": [0.0] * profiled})[kind][r] = \
                    e.self_cpu_time_total
    per_op = {k: (statistics.median(v["alone"]), statistics.median(v["heads"])) for k, v in ops.items()}
    return {**out, "last_step_skips_lm_head": skips, "positions": int(attn.shape[1])}, per_op


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--paired", type=int, default=30, help="repeats of the paired decode steps")
    ap.add_argument("--profiled", type=int, default=10, help="profiled pairs of steps (medians per operator)")
    ap.add_argument("--out", default="benchmarks/results/generation_profile.json")
    ap.add_argument("--answer", type=int, default=0, help="run the steps after an answer of this many tokens")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    backbone = Backbone.load(args.base)
    side = SideTasks(backbone, heads_for(backbone, args.heads), primary=False, max_length=64)
    prompts, names = PROMPTS[:args.batch], [f"head{i}" for i in range(args.heads)]
    side.generate(prompts, 2, names, ignore_eos=True)  # warm-up
    if args.answer:  # the prompts' own greedy answers of --answer tokens become part of the prefill
        prompts = [p + r["text"] for p, r in zip(prompts, side.generate(prompts, args.answer, [], ignore_eos=True))]
    paired, ops = paired_steps(side, prompts, names, args.paired, args.profiled)
    print("one decode step, CPU us (medians):", json.dumps(paired), flush=True)
    rows = sorted(ops, key=lambda k: -abs(ops[k][1] - ops[k][0]))
    table = [{"op": k, "alone_us": round(ops[k][0]), "heads_us": round(ops[k][1]),
              "added_us": round(ops[k][1] - ops[k][0])} for k in rows]
    total = {"alone_us": round(sum(v[0] for v in ops.values())), "heads_us": round(sum(v[1] for v in ops.values()))}
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    write_json(Path(args.out), {"settings": {**settings, "torch": torch.__version__, "threads": 1,
                                             "code": "PYTHONPATH" if os.environ.get("PYTHONPATH")
                                             else "this checkout's src", "unit": "CPU microseconds, one decode step"},
                                "paired_step": paired, "total": total, "ops": table})
    print(f"one decode step, self CPU us of the operators: alone {total['alone_us']}, "
          f"with {args.heads} heads {total['heads_us']} (+{total['heads_us'] - total['alone_us']})")
    print("| operator | alone | with heads | added |\n|---|---|---|---|")
    for r in table[:args.top]:
        print(f"| {r['op']} | {r['alone_us']} | {r['heads_us']} | {r['added_us']:+d} |")
    print(json.dumps(total))


if __name__ == "__main__":
    main()
