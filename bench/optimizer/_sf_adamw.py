"""Schedule-free AdamW (Defazio et al., 2024) written out plainly, for the corpus's runs.

The corpus's non-Polyak anytime reference runs. Not a product optimizer: slow, CPU, no
checkpoints.

Each step ``t`` with gradient ``g`` taken at ``y``::

    gamma_t = lr * min(1, t / warmup_steps)
    v       = beta2 v + (1 - beta2) g^2;       v_hat = v / (1 - beta2^t)
    z      -= gamma_t g / (sqrt(v_hat) + eps)
    c       = gamma_t^2 / sum_{s<=t} gamma_s^2
    x       = (1 - c) x + c z
    y       = beta x + (1 - beta) z           # the parameters hold y
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class ScheduleFreeAdamW:
    """Schedule-free AdamW over a list of parameters (which hold ``y``)."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        lr: float,
        warmup_steps: int = 0,
        beta: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
    ) -> None:
        self.params = params
        self.lr, self.warmup_steps, self.beta, self.beta2, self.eps = (
            lr,
            warmup_steps,
            beta,
            beta2,
            eps,
        )
        self.param_groups: list[dict[str, float]] = []  # nothing to schedule from outside
        self.t = 0
        self.weight_sum = 0.0
        self.x = [p.detach().clone() for p in params]
        self.z = [p.detach().clone() for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        gamma = self.lr * (min(1.0, self.t / self.warmup_steps) if self.warmup_steps else 1.0)
        self.weight_sum += gamma**2
        c = gamma**2 / self.weight_sum
        correction = 1 - self.beta2**self.t
        for p, x, z, v in zip(self.params, self.x, self.z, self.v, strict=True):
            if p.grad is None:
                continue
            v.mul_(self.beta2).addcmul_(p.grad, p.grad, value=1 - self.beta2)
            z.addcdiv_(p.grad, (v / correction).sqrt_().add_(self.eps), value=-gamma)
            x.lerp_(z, c)
            p.copy_(x * self.beta + z * (1 - self.beta))

    @contextmanager
    def averaged(self, module: torch.nn.Module | None = None) -> Iterator[None]:
        """Parameters hold ``x`` inside the block (and the module is in eval mode)."""
        saved = [p.detach().clone() for p in self.params]
        was_training = module.training if module is not None else False
        with torch.no_grad():
            for p, x in zip(self.params, self.x, strict=True):
                p.copy_(x)
        if module is not None:
            module.eval()
        try:
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(self.params, saved, strict=True):
                    p.copy_(s)
            if module is not None:
                module.train(was_training)
