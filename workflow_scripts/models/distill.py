"""Distilling the draft on the target: the target labels a fixed set of windows once, the draft trains on them.

Why cache: the MoE target's forward costs ~4x the dense one (top-4 experts) and the draft's training step
is ~10x cheaper than that, so labelling each token once and training the draft for several epochs over
the labels gives the draft the same signal for a fraction of the CPU time of an online teacher.
Only the teacher's top-k probabilities are kept, plus the mass of all other tokens as one bucket: the
loss is then the exact KL on that coarsened distribution, so the draft keeps a calibrated tail (matters
for rejection sampling at temperature > 0) at a few MB instead of a full vocabulary per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from workflow_scripts.models.training import autocast


@dataclass(frozen=True)
class TeacherLabels:
    """The target's top-k next-token distribution for every position of `windows`."""

    windows: torch.Tensor  # [n, seq_len] token ids
    probs: torch.Tensor  # [n, seq_len, k] teacher probabilities of its top-k tokens (the rest is 1 - sum)
    indices: torch.Tensor  # [n, seq_len, k] those tokens


@torch.no_grad()
def label_windows(teacher: torch.nn.Module, windows: torch.Tensor, top_k: int, dtype: str,
                  batch_size: int) -> TeacherLabels:
    """Run the teacher once over `windows` and keep its top-k distribution per position."""
    teacher.eval()
    probs, indices = [], []
    for i in tqdm(range(0, len(windows), batch_size), desc="teacher labels", unit="batch", dynamic_ncols=True):
        with autocast(dtype):
            logits = teacher(input_ids=windows[i : i + batch_size]).logits
        top = logits.float().softmax(-1).topk(top_k, dim=-1)
        probs.append(top.values)
        indices.append(top.indices)
    return TeacherLabels(windows, torch.cat(probs), torch.cat(indices))


def distill_loss(student: torch.nn.Module, labels: TeacherLabels, batch: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the student against the teacher's top-k + rest distribution (= KL up to a constant)."""
    logits = student(input_ids=labels.windows[batch]).logits.float()
    log_q = F.log_softmax(logits, dim=-1).gather(-1, labels.indices[batch])
    p = labels.probs[batch]
    p_rest = (1 - p.sum(-1)).clamp_min(0)
    log_q_rest = torch.log1p(-log_q.exp().sum(-1).clamp(max=1 - 1e-6))
    return -((p * log_q).sum(-1) + p_rest * log_q_rest).mean()
