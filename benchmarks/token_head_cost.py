"""The token head's training step on real CoNLL-2003 batch shapes: padded encoder against real-token feed-forward.

    PYTHONPATH=src python benchmarks/token_head_cost.py --steps 60 --repeats 3

Batches are the config's training batches (its batch size, shuffled, padded to the longest row, with
the MiniLM token counts of the real sentences); the head's input F is random (B, T, k) (values do not
change the work). Variants, each a forward + backward + AdamW step of the head alone:
    padded        nn.TransformerEncoder over the padded batch (the head before this change)
    real-tokens   the feed-forward over the real tokens only (heads.TokenHead now)
    + bf16        the same under torch.autocast('cpu', bfloat16) (train.precision=bf16)
    ffn W         real-tokens with head.dim_feedforward=W (a searched setting of `adalayers tune`)
Each repeat runs every variant once over the same batches in a rotating order; a variant's ratio
is the median over repeats of padded's time / its time. Writes <out>.json and <out>.md.
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from adalayers import config  # noqa: E402
from adalayers.recipes import service
from adalayers.data.encoding import batches  # noqa: E402
from adalayers.model.heads import TokenHead  # noqa: E402
from adalayers.store.run import atomic_write, write_json  # noqa: E402


def padded_forward(head: TokenHead, F, mask):
    return head.out(head.encoder(F, src_key_padding_mask=~mask))


def run(head, forward, shapes, k: int, bf16: bool) -> float:
    opt = torch.optim.AdamW(head.parameters(), lr=1e-4)
    head.train()
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for lengths in shapes:
        B, T = len(lengths), max(lengths)
        mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
        F = torch.randn(B, T, k, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = forward(head, F, mask)
            loss = out.float()[mask].logsumexp(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/conll.yaml")
    ap.add_argument("--steps", type=int, default=60, help="training batches per timing")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--widths", default="512,1024")
    ap.add_argument("--out", default="benchmarks/results/token_head_cost")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = config.load(args.config, ["train.device=cpu"])
    backbone, data, encoded = service.prepare(cfg)
    gen = torch.Generator().manual_seed(0)
    shapes = []
    for batch in batches(encoded["train"], cfg.train.batch_size, 0, shuffle=True, generator=gen):
        shapes.append(batch["attention_mask"].sum(1).tolist())
        if len(shapes) == args.steps:
            break
    real = sum(map(sum, shapes))
    padded_tokens = sum(len(s) * max(s) for s in shapes)
    k, C = cfg.mixer.k, len(data.labels)
    torch.manual_seed(0)
    base = TokenHead(k, C, cfg.head)
    variants = {"padded": (base, padded_forward, False), "real-tokens": (base, TokenHead.forward, False),
                "real-tokens + bf16": (base, TokenHead.forward, True)}
    for w in [int(x) for x in args.widths.split(",") if x]:
        h = copy.deepcopy(cfg.head)
        h.dim_feedforward = w
        torch.manual_seed(0)
        variants[f"real-tokens, ffn {w}"] = (TokenHead(k, C, h), TokenHead.forward, False)
    names = list(variants)
    times = {n: [] for n in names}
    for r in range(args.repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            head, fwd, bf16 = variants[n]
            times[n].append(run(copy.deepcopy(head), fwd, shapes, k, bf16))
    rows = [{"variant": n, "median_seconds": round(statistics.median(times[n]), 3),
             "speedup_vs_padded": round(statistics.median(p / t for p, t in zip(times["padded"], times[n])), 3)}
            for n in names]
    settings = {"config": args.config, "k": k, "dim_feedforward": cfg.head.dim_feedforward,
                "encoder_layers": cfg.head.encoder_layers, "batch_size": cfg.train.batch_size, "steps": len(shapes),
                "real_tokens": real, "padded_tokens": padded_tokens, "repeats": args.repeats, "threads": args.threads,
                "torch": torch.__version__, "machine": platform.machine(),
                "note": "shared 2-core machine; ratios from the same repeat"}
    write_json(Path(args.out + ".json"), {"settings": settings, "results": rows})
    md = [f"# Token head training step on {data.name} batch shapes ({len(shapes)} batches, "
          f"{real:,} real of {padded_tokens:,} padded tokens)", "", f"Settings: `{json.dumps(settings)}`", "",
          "| variant | seconds (median) | speed-up vs padded |", "|---|---:|---:|"]
    md += [f"| {r['variant']} | {r['median_seconds']:.2f} | {r['speedup_vs_padded']:.2f}x |" for r in rows]
    atomic_write(Path(args.out + ".md"), "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
