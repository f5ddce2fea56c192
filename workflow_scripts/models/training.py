"""Deterministic training helpers: the packed token stream, batches, and one generic loop.

Everything random draws from explicit seeded generators and the loops run a fixed number of steps, so
the same seed and corpus give bitwise-identical weights (with a fixed thread count).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer
from tqdm import tqdm


def token_stream(tok: Tokenizer, docs: list[str], eos_id: int, seed: int | None = None) -> torch.Tensor:
    """All `docs` tokenized, each followed by EOS, concatenated (in a seeded shuffled order if `seed`)."""
    order = list(range(len(docs)))
    if seed is not None:
        order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(seed)).tolist()
    encoded = tok.encode_batch([docs[i] for i in order])
    ids = [t for enc in encoded for t in (*enc.ids, eos_id)]
    return torch.tensor(ids, dtype=torch.long)


def random_windows(stream: torch.Tensor, batch_size: int, seq_len: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless [batch_size, seq_len] windows at seeded random offsets of `stream`."""
    if len(stream) <= seq_len:
        raise ValueError(f"token stream of {len(stream)} tokens is shorter than seq_len={seq_len}")
    gen = torch.Generator().manual_seed(seed)
    offsets_range = torch.arange(seq_len)
    while True:
        starts = torch.randint(0, len(stream) - seq_len, (batch_size,), generator=gen)
        yield stream[starts[:, None] + offsets_range]


def shuffled_batches(n_items: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless batches of item indices: every item once per epoch, in a new seeded order each epoch."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n_items, generator=gen)
        for i in range(0, n_items - batch_size + 1, batch_size):
            yield order[i : i + batch_size]


def sequential_windows(stream: torch.Tensor, seq_len: int, max_tokens: int) -> torch.Tensor:
    """Non-overlapping [n, seq_len] windows from the start of `stream`, at most `max_tokens` tokens."""
    n = min(len(stream), max_tokens) // seq_len
    if n == 0:
        raise ValueError(f"held-out stream of {len(stream)} tokens is shorter than seq_len={seq_len}")
    return stream[: n * seq_len].view(n, seq_len)


def autocast(dtype: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU (fp32 master weights), or nothing for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=getattr(torch, dtype))


@dataclass(frozen=True)
class TrainStats:
    """What a training phase reports into build_info.json."""

    steps: int
    tokens_seen: int
    final_loss: float
    wall_s: float


def train(
    model: torch.nn.Module,
    batches: Iterator[torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    *,
    steps: int,
    tokens_per_step: int,
    lr: float,
    warmup_steps: int,
    weight_decay: float,
    dtype: str,
    desc: str,
) -> TrainStats:
    """AdamW with linear warm-up then cosine decay to 10%, grad-clipped; tqdm shows loss and ETA."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    tokens, loss_value, start = 0, float("nan"), time.perf_counter()
    with tqdm(range(steps), desc=desc, unit="step", dynamic_ncols=True) as bar:
        for _ in bar:
            batch = next(batches)
            with autocast(dtype):
                loss = loss_fn(batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            tokens += tokens_per_step
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"{desc}: loss became {loss_value} at step {bar.n}; lower the lr")
            bar.set_postfix(loss=f"{loss_value:.3f}")
    model.eval()
    return TrainStats(steps, tokens, loss_value, time.perf_counter() - start)
