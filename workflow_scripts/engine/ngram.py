"""NGRAM speculation's proposer: continue the sequence the way it continued last time.

Looks for the latest earlier occurrence of the sequence's last n tokens (longest n first) in
prompt + output, and proposes the tokens that followed it. No model, so the proposal is
deterministic (a point mass for the acceptance rule).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MAX_NGRAM = 4
MIN_NGRAM = 1


def propose(tokens: list[int], k: int, max_n: int = MAX_NGRAM, min_n: int = MIN_NGRAM) -> list[int]:
    """Up to k tokens that followed the most recent earlier match of the longest matching suffix."""
    if k <= 0 or len(tokens) < min_n + 1:
        return []
    seq = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, len(seq) - 1), min_n - 1, -1):
        windows = sliding_window_view(seq[:-1], n)  # windows starting before the suffix itself
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start : start + k].tolist()
    return []
