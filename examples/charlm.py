"""A small character-level transformer trained on the Python standard library's own source.

Reusable pieces for benchmarks, demos and studies that need a real (if small) language-model
training run on CPU with nothing downloaded:

* :func:`load_stdlib_text` reads the ``.py`` files of the running interpreter's standard library
  (found with :mod:`sysconfig`), in a fixed order, into train and validation text. Validation is
  every tenth *file*, so the two splits come from the same distribution but share no file.
* :class:`CharDataset` encodes the text with a fixed printable-ASCII vocabulary and serves
  random ``(input, target)`` blocks from a seeded generator.
* :class:`CharTransformer` is a pre-LayerNorm GPT: causal self-attention
  (``scaled_dot_product_attention``), a GELU MLP, tied input/output embeddings.
* :func:`evaluate` averages the loss over a fixed set of batches.

Sizing: ``CharTransformer(vocab_size, d_model=128, n_layers=4, n_heads=4, block_size=64)`` has
about 0.8M parameters and runs a training step on a batch of 32 in roughly 0.1-0.2 s on two CPU
cores, so a few hundred steps take a minute or two.
"""

from __future__ import annotations

import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "VOCAB",
    "CharDataset",
    "CharTransformer",
    "StdlibText",
    "evaluate",
    "load_stdlib_text",
]

#: Tab, newline and printable ASCII; any other character is mapped to ``"?"``.
VOCAB = "\t\n" + "".join(chr(c) for c in range(32, 127))
_UNKNOWN = VOCAB.index("?")
_SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}

Split = Literal["train", "val"]


@dataclass(frozen=True)
class StdlibText:
    """Train and validation text, and where it came from."""

    train: str
    val: str
    root: Path
    n_files: int


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files in a fixed (sorted) order, test suites excluded."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(
        p for p in base.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(base).parts[:-1])
    )


def load_stdlib_text(max_chars: int = 4_000_000, *, val_every: int = 10) -> StdlibText:
    """Read up to ``max_chars`` characters of standard-library source.

    Args:
        max_chars: total characters to read (train + validation), stopping at a file boundary.
        val_every: every ``val_every``-th file goes to the validation split.

    Returns:
        The two splits. The same interpreter gives the same text on every machine.
    """
    train: list[str] = []
    val: list[str] = []
    total = 0
    files = stdlib_files()
    used = 0
    for i, path in enumerate(files):
        if total >= max_chars:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        (val if i % val_every == val_every - 1 else train).append(text)
        total += len(text)
        used += 1
    root = Path(sysconfig.get_paths()["stdlib"])
    return StdlibText(train="".join(train), val="".join(val), root=root, n_files=used)


def encode(text: str) -> Tensor:
    """Characters to token ids (``int64``) with the fixed :data:`VOCAB`."""
    table = {ch: i for i, ch in enumerate(VOCAB)}
    return torch.tensor([table.get(ch, _UNKNOWN) for ch in text], dtype=torch.long)


def decode(ids: Tensor) -> str:
    """Token ids back to text."""
    return "".join(VOCAB[int(i)] for i in ids)


class CharDataset:
    """Encoded train/validation token streams with random-block batching.

    Args:
        text: the two splits, from :func:`load_stdlib_text`.
    """

    def __init__(self, text: StdlibText) -> None:
        self.vocab_size = len(VOCAB)
        self.data: dict[Split, Tensor] = {"train": encode(text.train), "val": encode(text.val)}

    def get_batch(
        self, split: Split, batch_size: int, block_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` random blocks: inputs ``(B, T)`` and next-character targets ``(B, T)``.

        The positions come only from ``generator``, so two runs given equally seeded
        generators see exactly the same batches.
        """
        data = self.data[split]
        starts = torch.randint(0, data.numel() - block_size - 1, (batch_size,), generator=generator)
        offsets = torch.arange(block_size)
        x = data[starts[:, None] + offsets]
        y = data[starts[:, None] + offsets + 1]
        return x, y


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, h: Tensor) -> Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.ln1(h)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(att.transpose(1, 2).reshape(b, t, d))
        out: Tensor = h + self.out(F.gelu(self.fc(self.ln2(h))))
        return out


class CharTransformer(nn.Module):
    """A pre-LayerNorm GPT over characters with tied embeddings.

    Args:
        vocab_size: number of token ids.
        d_model: width of the residual stream.
        n_layers: number of transformer blocks.
        n_heads: attention heads per block (must divide ``d_model``).
        block_size: maximum context length (learned position embeddings).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 128,
        n_layers: int = 4,
        n_heads: int = 4,
        block_size: int = 64,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads ({n_heads}) must divide d_model ({d_model})")
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(block_size, d_model)
        blocks = [_Block(d_model, n_heads) for _ in range(n_layers)]
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = nn.LayerNorm(d_model)
        self.apply(self._init)
        # GPT-2's scaled init of residual projections keeps the stream's variance flat in depth.
        for block in blocks:
            for proj in (block.proj, block.out):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor:
        """Logits ``(B, T, vocab)``, or the mean cross-entropy if ``targets`` are given."""
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.block_size}")
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            h = block(h)
        logits: Tensor = self.ln_f(h) @ self.tok.weight.T
        if targets is None:
            return logits
        loss: Tensor = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return loss


@torch.no_grad()
def evaluate(
    model: CharTransformer,
    dataset: CharDataset,
    split: Split = "val",
    *,
    batches: int = 8,
    batch_size: int = 32,
    block_size: int = 64,
    seed: int = 1234,
) -> float:
    """Mean loss over ``batches`` fixed batches (the same ones on every call with this seed)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(batches):
        x, y = dataset.get_batch(split, batch_size, block_size, gen)
        total += float(model(x, y))
    model.train(was_training)
    return total / batches
