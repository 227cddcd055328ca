"""Markdown tables of benchmarks/llm_server.py's JSON: one row per server and load (medians over repeats),
then the issues' goals (52: adalayers without heads; 53: the four heads), met or missed, with the measured values.

    python benchmarks/llm_server_table.py benchmarks/results/llm_server/gemma3-270m_t2.json [...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _f(v, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def table(path: Path) -> str:
    r = json.loads(path.read_text())
    s = r["settings"]
    threads = f"{s['threads']} thread(s)" if s["threads"] else "each server's default threads"
    drawn = s.get("sampling", {}).get("temperature")  # older results: greedy, no "sampling"
    if drawn:
        threads += ", sampled: " + ", ".join(f"{k} {v}" for k, v in s["sampling"].items())
    lines = [f"**{s['base']}**, {threads}, ctx {s['ctx_size']}, {s['new_tokens']} new tokens per client, "
             f"medians of {s['repeats']} rotating repeats (`{path.as_posix()}`)", "",
             "| server | clients | tokens/s | × llama-server | TTFT p50 / p99 (s) | inter-token p50 / p99 (ms) | "
             "tokens per client | peak RSS (MB) | start-up (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, m in r["medians"].items():
        for c, cell in m["cells"].items():
            ratio = r["ratios"].get(name, {}).get(c, {}).get("tokens_per_s_vs_llama_server")
            itl = f"{_f(cell['itl_p50'] and cell['itl_p50'] * 1e3, '.0f')} / {_f(cell['itl_p99'] and cell['itl_p99'] * 1e3, '.0f')}"
            toks = (str(cell["tokens_per_client_min"]) if cell["tokens_per_client_min"] == cell["tokens_per_client_max"]
                    else f"{cell['tokens_per_client_min']}–{cell['tokens_per_client_max']}")
            lines.append(f"| {name} | {c} | {_f(cell['tokens_per_s'], '.1f')} | {_f(ratio, '.2f')} | "
                         f"{_f(cell['ttft_p50'], '.2f')} / {_f(cell['ttft_p99'], '.2f')} | {itl} | {toks}"
                         f"{' (errors: %d)' % cell['errors'] if cell['errors'] else ''} | "
                         f"{m['peak_rss_mb']:.0f} | {m['startup_s']:.1f} |")
    failed = {n: x["error"] for rep in r["repeats"] for n, x in rep.items() if isinstance(x, dict) and "error" in x}
    lines += [""] + [f"- {n} did not run: {e}" for n, e in failed.items()]
    lines += ["", "| goal | measured | |", "|---|---|---|"]
    for goal, g in r["goals"].items():
        v = g["value"]
        shown = ", ".join(f"{c}: {_f(x, '.2f')}" for c, x in v.items()) if isinstance(v, dict) else _f(v, ".2f")
        unmeasured = v is None or (isinstance(v, dict) and all(x is None for x in v.values()))
        lines.append(f"| {goal} | {shown} | {'not run' if unmeasured else 'met' if g['met'] else 'missed'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(table(Path(p)) for p in sys.argv[1:]))
