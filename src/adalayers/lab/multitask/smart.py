"""SMART (Jiang et al. 2020): smoothness-inducing adversarial regularisation + Bregman proximal point.

Smoothness: perturb the word embeddings (every side of a pair) by delta, |delta|_inf <= eps:
a random start (std sigma), then `steps` ascent steps delta += step_size * sign(grad), clipped back
into the ball; the term is the divergence between the outputs at x + delta and at x (symmetric KL
for classes and binary outputs, MSE for values).
Bregman proximal point: the divergence between the model's outputs and those of an EMA
(momentum beta) copy of the trainable parameters, which keeps each update close to the last ones.
"""
from __future__ import annotations

import torch
import torch.nn.functional as nnf
from torch.func import functional_call

from adalayers.kinds import TaskKind
from adalayers.lab.multitask.heads import Output


def _sym_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    lp, lq = nnf.log_softmax(p_logits.float(), -1), nnf.log_softmax(q_logits.float(), -1)
    return ((lp.exp() - lq.exp()) * (lp - lq)).sum(-1).mean()  # KL(p||q) + KL(q||p)


def divergence(output: Output, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Symmetric KL of two class outputs (one logit s: the classes (1 - sigmoid(s), sigmoid(s))), MSE of values."""
    if output.kind == TaskKind.CLASSIFICATION:
        return _sym_kl(output.logits(a), output.logits(b))
    return nnf.mse_loss(a.float(), b.float())


def perturb(fn, embeds: list[torch.Tensor], clean: torch.Tensor, output: Output, eps: float, sigma: float,
            steps: int, step_size: float) -> list[torch.Tensor]:
    """The adversarial deltas (detached), one per side, each within the infinity-norm ball of radius eps."""
    base = [e.detach() for e in embeds]
    deltas = [(torch.randn_like(e) * sigma).clamp(-eps, eps) for e in base]
    for _ in range(steps):
        deltas = [d.requires_grad_(True) for d in deltas]
        div = divergence(output, fn([e + d for e, d in zip(base, deltas)]), clean.detach())
        grads = torch.autograd.grad(div, deltas, allow_unused=True)
        deltas = [(d.detach() + step_size * (g.sign() if g is not None else 0)).clamp(-eps, eps)
                  for d, g in zip(deltas, grads)]
    return [d.detach() for d in deltas]


def smoothness(fn, embeds: list[torch.Tensor], clean: torch.Tensor, output: Output, cfg) -> torch.Tensor:
    deltas = perturb(fn, embeds, clean, output, cfg.eps, cfg.sigma, cfg.steps, cfg.step_size)
    return divergence(output, fn([e + d for e, d in zip(embeds, deltas)]), clean)


class EMA:
    """A momentum copy of a module's trainable parameters."""

    def __init__(self, module: torch.nn.Module, beta: float):
        self.beta = beta
        self.params = {k: v.detach().clone() for k, v in module.named_parameters() if v.requires_grad}

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        for k, v in module.named_parameters():
            if k in self.params:
                self.params[k].mul_(self.beta).add_(v.detach(), alpha=1 - self.beta)

    @torch.no_grad()
    def outputs(self, module: torch.nn.Module, *args) -> torch.Tensor:
        return functional_call(module, self.params, args)


def bregman(ema: EMA, module, output: Output, out: torch.Tensor, *args) -> torch.Tensor:
    return divergence(output, out, ema.outputs(module, *args))
