"""What one generation request asks for, typed: GenerationParams, built once (from keywords, or by the service
from any route's request, serve/params.py) and read by infer/generate.Job.

    params = GenerationParams(max_new_tokens=32, tasks=("cola",), sampling=Sampling(do_sample=True, seed=3))
    params = GenerationParams.of(max_new_tokens=32, tasks=["cola"], do_sample=True, seed=3)   # stream's keywords
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sampling:
    """Greedy (do_sample False), or a draw at `temperature` among the top_k (0: all) within the nucleus top_p,
    from a generator seeded with `seed` (None: unseeded)."""
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class GenerationParams:
    """max_new_tokens per prompt; tasks (None: every head); steps (sequence heads' values after every token);
    answer_only (heads that read the answer alone); guard {head: (label, threshold) or [such rules]};
    ignore_eos (always max_new_tokens); stop strings; raw (the prompts are read as given, without the heads'
    task.template)."""
    max_new_tokens: int = 32
    tasks: tuple[str, ...] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    steps: bool = False
    answer_only: tuple[str, ...] = ()
    guard: tuple[tuple[str, object], ...] = ()  # (head, rule) pairs: a frozen dict
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    raw: bool = False

    @classmethod
    def of(cls, max_new_tokens: int = 32, tasks=None, do_sample: bool = False, temperature: float = 1.0,
           top_k: int = 0, seed: int | None = None, steps: bool = False, answer_only=(), guard=None,
           ignore_eos: bool = False, top_p: float = 1.0, stop=(), raw: bool = False) -> GenerationParams:
        """From infer/generate.stream's keywords (lists and dicts as a caller writes them)."""
        return cls(max_new_tokens, None if tasks is None else tuple(tasks),
                   Sampling(bool(do_sample), temperature, top_k, top_p, seed), bool(steps), tuple(answer_only),
                   tuple((guard or {}).items()), bool(ignore_eos), tuple(stop), bool(raw))

    @property
    def guards(self) -> dict:
        """The guard as {head: rule}."""
        return dict(self.guard)
