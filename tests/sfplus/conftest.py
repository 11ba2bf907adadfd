"""Shared helpers for the sfplus tests: a real small model, deterministic batches, a train loop."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 16


class TinyNet(nn.Module):
    """Embedding -> LayerNorm -> MLP -> logits: every kind of tensor a transformer has (a 2-D
    embedding, 1-D norm weights and biases, matrices), and one matrix larger than the CPU block
    size (65,536 elements) so the blocked per-tensor path really splits it."""

    def __init__(self, d: int = 32, hidden: int = 2100) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(self.emb(idx)))))


def make_model(seed: int = 0, dtype: torch.dtype = torch.float64, **kw: int) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet(**kw).to(dtype)


def batches(n: int, batch_size: int = 32, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable task (next token = 3 * token + 1 mod VOCAB) with 10% label noise."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, VOCAB, (batch_size,), generator=g)
        y = (3 * x + 1) % VOCAB
        noise = torch.rand(batch_size, generator=g) < 0.1
        y = torch.where(noise, torch.randint(0, VOCAB, (batch_size,), generator=g), y)
        out.append((x, y))
    return out


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    data: list[tuple[torch.Tensor, torch.Tensor]],
    on_step: Callable[[int], None] | None = None,
) -> list[float]:
    losses = []
    for i, batch in enumerate(data):
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step(loss=loss)
        opt.zero_grad()
        losses.append(loss.item())
        if on_step is not None:
            on_step(i)
    return losses


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def max_rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest |a - b| relative to max |b|, per tensor."""
    return max(
        ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item()
        for x, y in zip(a, b, strict=True)
    )


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Run these tests on one intra-op thread. The models are tiny, and on a shared 2-core
    machine two OpenMP threads that must meet at every small op are 10-20x slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
