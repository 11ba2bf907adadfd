"""A synthetic ScheduleFree+ run: the loss and every telemetry key the client hook streams,
deterministic per step, in the REST API's columnar batch shape (for the dashboards' tests and
bench).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from curvecast.contract import LEGACY_TELEMETRY_PREFIXES

if TYPE_CHECKING:  # the caller brings its client (httpx is a test dependency, not a server one)
    import httpx

__all__ = ["batch", "create_run", "run_config", "stream"]

A, B, C = 60.0, 300.0, 2.0  # loss(t) = A / sqrt(t + B) + C
#: The synthetic run logs its telemetry under the legacy ``sfplus/`` prefix by default, so the
#: pages' tests keep covering data stored before the prefix was fixed (the hook writes ``opt/``).
LEGACY_PREFIX = LEGACY_TELEMETRY_PREFIXES[0]


def run_config(total_steps: int, warmup_steps: int = 200, weight_decay: float = 5.0
               ) -> dict[str, Any]:
    """A run's config as the client sends it."""
    return {"total_steps": total_steps, "warmup_steps": warmup_steps,
            "c_warmup": 2 * warmup_steps, "weight_decay": weight_decay, "lr": 1.0,
            "optimizer": {"name": "ScheduleFreePlus"}}


def batch(start: int, stop: int, *, total_steps: int, warmup_steps: int = 200,
          weight_decay: float = 5.0, prefix: str = LEGACY_PREFIX, norms_every: int = 10,
          eval_every: int | None = None, seed: int = 0, spikes: bool = True,
          wall0: float = 1.7e9, seconds_per_step: float = 0.05,
          curve: tuple[float, float, float] = (A, B, C), eval_offset: float = -0.05
          ) -> dict[str, Any]:
    """Steps [start, stop) as one columnar batch body (``null`` where a key is not logged);
    the loss follows ``a / sqrt(t + b) + c`` (``curve``) plus noise and rare spikes, the eval
    loss (every ``eval_every`` steps) the same curve shifted by ``eval_offset``."""
    a, b, c0 = curve
    t = np.arange(start, stop, dtype=np.float64)
    rng = np.random.default_rng([seed, start])
    n = len(t)
    noise = rng.normal(0.0, 0.03, n)
    loss = a / np.sqrt(t + b) + c0 + noise
    if spikes:  # rare loss spikes: downsampled charts must still show them
        hit = (t.astype(np.int64) * 2654435761 % 100_003) < 3
        loss[hit] += 1.5
    warm = np.minimum(1.0, (t + 1) / warmup_steps)
    eta = 0.6 / np.sqrt(1.0 + t / 800.0) * np.exp(rng.normal(0, 0.08, n))
    alpha = warm * 1e-2 * eta
    grad_l1 = 2.0e4 * (1.0 + 1.5 / np.sqrt(1.0 + t / 300.0)) * np.exp(rng.normal(0, 0.1, n))
    denom = math.sqrt(math.pi / 2) * 2.0e4 * (1.0 + 1.5 / np.sqrt(1.0 + (t - 50).clip(0) / 300.0))
    c_warmup = 2 * warmup_steps
    # As the optimizer's with equal weights: 1 up to c_warmup + 1 (the first weight over itself).
    c = np.where(t <= c_warmup, 1.0, 1.0 / np.maximum(1.0, t - c_warmup))
    beta = 0.9 + 0.08 * np.minimum(1.0, t / total_steps)
    values: dict[str, list[Any]] = {
        "loss": loss.tolist(),
        prefix + "eta": eta.tolist(),
        prefix + "alpha": alpha.tolist(),
        prefix + "loss": loss.tolist(),
        prefix + "inner": (0.01 * rng.normal(0, 1, n)).tolist(),
        prefix + "numerator": (loss - 1.5).tolist(),
        prefix + "grad_l1": grad_l1.tolist(),
        prefix + "denom_ema": denom.tolist(),
        prefix + "c": c.tolist(),
        prefix + "sf_beta": beta.tolist(),
        prefix + "warmup": warm.tolist(),
        prefix + "gamma_max": np.maximum.accumulate(alpha).tolist(),
    }
    logged = (t.astype(np.int64) % norms_every) == 0
    z = 40.0 + 60.0 * (1.0 - np.exp(-t / 2000.0))
    ratio = math.sqrt(2 * weight_decay) * (1.0 + 0.8 * np.exp(-t / 1500.0))
    norms = {"x_l2": z * 0.97, "y_l2": z * 0.985, "z_l2": z, "grad_l2": z * ratio}
    for name, arr in norms.items():
        values[prefix + name] = [float(v) if ok else None
                                 for v, ok in zip(arr, logged, strict=True)]
    if eval_every:
        on = (t.astype(np.int64) % eval_every) == 0
        ev = a / np.sqrt(t + b) + c0 + eval_offset + rng.normal(0, 0.005, n)
        values["eval_loss"] = [float(v) if ok else None for v, ok in zip(ev, on, strict=True)]
    return {"steps": t.astype(np.int64).tolist(),
            "wall_time": (wall0 + t * seconds_per_step).tolist(), "values": values}


def create_run(client: httpx.Client, run_id: Any, project: str, *, name: str = "synthetic",
               total_steps: int = 20_000, **config: Any) -> dict[str, Any]:
    """``PUT`` the run with a ScheduleFree+ config."""
    body = {"project": project, "name": name,
            "config": {**run_config(total_steps), **config}}
    resp = client.put(f"/api/v1/runs/{run_id}", json=body)
    resp.raise_for_status()
    return dict(resp.json())


def stream(client: httpx.Client, run_id: Any, start: int, stop: int, *, total_steps: int,
           chunk: int = 4000, **kwargs: Any) -> None:
    """Post steps [start, stop) in batches of ``chunk`` steps."""
    for lo in range(start, stop, chunk):
        body = batch(lo, min(stop, lo + chunk), total_steps=total_steps, **kwargs)
        resp = client.post(f"/api/v1/runs/{run_id}/metrics", json=body, timeout=120)
        resp.raise_for_status()
