"""Which task's batch comes next. A step is a list of (task, batch indices); every schedule
visits each task's batches exactly once per epoch (joint: once, and then again while others finish).

round_robin   t1, t2, t3, t1, t2, t3, ... (a task drops out when its batches run out)
proportional  all batches of all tasks in one random order: each task's share of the steps is its
              share of the data (MT-DNN)
joint         one batch of every task per step (PCGrad needs every task's gradient at once);
              ceil(total batches / tasks) steps, a task that runs out starts a new shuffled pass
"""
from __future__ import annotations

import math
import random

import torch

from adalayers.engine.predict import in_order


def plan(kind: str, sizes: dict[str, int], batch_size: int, seed: int) -> list[list[tuple[str, list[int]]]]:
    gen = torch.Generator().manual_seed(seed)
    per_task = {t: in_order(n, batch_size, gen) for t, n in sizes.items()}
    if kind == "round_robin":
        steps, i = [], 0
        while any(i < len(b) for b in per_task.values()):
            steps += [[(t, b[i])] for t, b in per_task.items() if i < len(b)]
            i += 1
        return steps
    if kind == "proportional":
        steps = [[(t, b)] for t, bs in per_task.items() for b in bs]
        random.Random(seed).shuffle(steps)
        return steps
    if kind == "joint":
        total = sum(len(b) for b in per_task.values())
        n_steps = math.ceil(total / len(per_task))
        queues = {t: list(b) for t, b in per_task.items()}
        steps = []
        for _ in range(n_steps):
            step = []
            for t in per_task:
                if not queues[t]:
                    queues[t] = in_order(sizes[t], batch_size, gen)
                step.append((t, queues[t].pop(0)))
            steps.append(step)
        return steps
    raise ValueError(f"unknown schedule {kind!r}")
