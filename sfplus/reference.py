"""A slow, literal transcription of the paper's Algorithm 1: the oracle for the fast optimizer.

Nothing here is optimised. ``x``, ``y`` and ``z`` are stored explicitly, every parameter is
visited in a Python loop, every scalar is a Python float computed with ``.item()``, and the
lines follow Algorithm 1 ("ScheduleFree+ (AdamC + Schedule-Free + Polyak)") in order, so that a
reader can check it against the paper line by line. The tests compare
:class:`sfplus.ScheduleFreePlus` with it; do not use it for training.

Conventions shared with the fast optimizer (where Algorithm 1 is silent):

* The linear multiplicative warmup ``gamma_t = min(1, t / warmup_steps)`` times ``lr`` is
  Algorithm 1's warmup schedule ``gamma_t``; ``c_warmup=None`` means ``2 * warmup_steps``.
* ``f_star`` is subtracted in the numerator (Algorithm 1 has ``f* = 0``).
* ``eta = 0`` when the denominator is 0 (all-zero gradients), instead of dividing by zero.
* A parameter without a gradient is skipped (``x``, ``z`` and its Adam moments stay), except
  that ``y = beta_t x + (1 - beta_t) z`` is re-formed with the current beta; its Adam bias
  correction counts only the steps it took (as ``torch.optim.Adam`` does).
* Under ``torch.distributed`` the loss is averaged over ranks (DDP-replicated parameters only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim.optimizer import ParamsT

__all__ = ["ReferenceScheduleFreePlus"]


class ReferenceScheduleFreePlus(torch.optim.Optimizer):
    """Algorithm 1, literally. Same constructor arguments as :class:`sfplus.ScheduleFreePlus`.

    Per parameter it keeps ``x``, ``y``, ``z``, ``m``, ``v`` (plus the parameter itself: six
    parameter-sized tensors, like the public reference implementation).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        sf_beta: float = 0.9,
        sf_beta_max: float = 0.965,
        anneal_steps: int = 0,
        warmup_steps: int = 0,
        c_warmup: int | None = None,
        r: float = 0.0,
        weight_lr_power: float = 2.0,
        polyak_beta: float = 0.9,
        f_star: float = 0.0,
        foreach: bool | None = None,
    ) -> None:
        del foreach  # accepted for signature compatibility; there is only the slow path
        defaults = dict(  # noqa: C408 - mirrors the signature
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            sf_beta=sf_beta,
            sf_beta_max=sf_beta_max,
            anneal_steps=anneal_steps,
            warmup_steps=warmup_steps,
            c_warmup=c_warmup,
            r=r,
            weight_lr_power=weight_lr_power,
            polyak_beta=polyak_beta,
            f_star=f_star,
        )
        super().__init__(params, defaults)
        # Initialize Polyak EMA e_0 = 0, and per group W_0 = 0, gamma_max = eps.
        self.t = 0
        self.e = 0.0
        self.W = [0.0 for _ in self.param_groups]
        self.gamma_max = [float(g["eps"]) for g in self.param_groups]
        self.training = True
        self.last: dict[str, float] = {}

    @torch.no_grad()
    def eval(self) -> None:
        """Parameters hold x."""
        if self.training:
            for group in self.param_groups:
                for p in group["params"]:
                    if "x" in self.state[p]:
                        p.copy_(self.state[p]["x"])
            self.training = False

    @torch.no_grad()
    def train(self) -> None:
        """Parameters hold y."""
        if not self.training:
            for group in self.param_groups:
                for p in group["params"]:
                    if "y" in self.state[p]:
                        p.copy_(self.state[p]["y"])
            self.training = True

    @torch.no_grad()
    def step(
        self, closure: Callable[[], Any] | None = None, *, loss: Tensor | float | None = None
    ) -> Any:
        """One step of Algorithm 1; ``loss`` is ``f(y_{t-1})`` for the gradients in ``.grad``."""
        if not self.training:
            raise RuntimeError("reference optimizer: step() in eval mode")
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if loss is None:
            raise ValueError("reference optimizer: pass loss= or a closure")
        g0 = self.param_groups[0]
        self.t += 1
        t = self.t

        # 1. Schedule-Free momentum annealing.
        if g0["anneal_steps"] > 0:
            tau = min(t / g0["anneal_steps"], 1.0)
            beta_t = 1 - math.exp(
                (1 - tau) * math.log(1 - g0["sf_beta"]) + tau * math.log(1 - g0["sf_beta_max"])
            )
        else:
            beta_t = g0["sf_beta"]

        # Lazy initialisation: x_0 = y_0 = z_0 = theta_0, m_0 = v_0 = 0.
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and "z" not in self.state[p]:
                    st = self.state[p]
                    st["x"] = p.detach().clone()
                    st["y"] = p.detach().clone()
                    st["z"] = p.detach().clone()
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                    st["t"] = 0

        # 2. Global metrics and the Polyak step size.
        F = float(loss.item() if isinstance(loss, Tensor) else loss)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            buf = torch.tensor([F], dtype=torch.float64)
            dist.all_reduce(buf)
            F = buf.item() / dist.get_world_size()
        L1 = 0.0
        ip = 0.0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                L1 += g.abs().sum().item()
                ip += (g * (st["z"] - st["x"])).sum().item()
        I_t = beta_t * ip
        pb = g0["polyak_beta"]
        self.e = pb * self.e + (1 - pb) * L1 * math.sqrt(math.pi / 2)
        e_hat = self.e / (1 - pb**t)
        eta = max(0.0, F + I_t - g0["f_star"]) / e_hat if e_hat > 0 else 0.0
        self.last = {"loss": F, "inner": I_t, "grad_l1": L1, "denom_ema": e_hat, "eta": eta}

        for gi, group in enumerate(self.param_groups):
            warmup = min(1.0, t / group["warmup_steps"]) if group["warmup_steps"] > 0 else 1.0
            gamma_t = warmup * group["lr"]
            alpha = gamma_t * eta
            self.gamma_max[gi] = max(alpha, self.gamma_max[gi])

            # 3. Schedule-Free averaging weights.
            c_warmup = (
                group["c_warmup"] if group["c_warmup"] is not None else 2 * group["warmup_steps"]
            )
            if t <= c_warmup:
                c = 1.0
            else:
                w = t ** group["r"] * self.gamma_max[gi] ** group["weight_lr_power"]
                self.W[gi] += w
                c = w / self.W[gi] if self.W[gi] > 0 else 1.0
            if gi == 0:
                self.last.update(alpha=alpha, gamma_max=self.gamma_max[gi], c=c, sf_beta=beta_t)

            # 4. Per-parameter updates.
            lam = group["weight_decay"]
            beta1, beta2 = group["betas"]
            eps = group["eps"]
            for p in group["params"]:
                st = self.state[p]
                if p.grad is None:
                    if "z" in st:
                        st["y"] = beta_t * st["x"] + (1 - beta_t) * st["z"]
                        p.copy_(st["y"])
                    continue
                g = p.grad
                st["t"] += 1
                tp = st["t"]
                x, y, z, m, v = st["x"], st["y"], st["z"], st["m"], st["v"]
                z = z - alpha**2 * lam * y  # decoupled AdamC weight decay
                m = beta1 * m + (1 - beta1) * g  # first moment
                v = beta2 * v + (1 - beta2) * g * g  # second moment
                m_hat = m / (1 - beta1**tp)
                v_hat = v / (1 - beta2**tp)
                z = z - alpha * m_hat / (v_hat.sqrt() + eps)  # Adam step on z
                x = (1 - c) * x + c * z  # evaluation point
                y = beta_t * x + (1 - beta_t) * z  # next query point
                st.update(x=x, y=y, z=z, m=m, v=v)
                p.copy_(y)
        return loss
