"""Projections through oneDNN, with each weight reordered once, at load, into oneDNN's blocked layout.

Why: an engine step multiplies 1-48 rows by each weight, and for such thin products MKL's sgemm (what
`F.linear` and `x @ w` call) reads a cold 1 MB weight at 10-20 GB/s; oneDNN's matmul on a prepacked
weight runs 2-48 rows 1.4-2.5x faster (docs/embedded_engine.md). This is the path inductor takes for
frozen CPU linears. A single fp32 row is the exception: MKL's GEMV on an input-major copy ([in, out],
`x @ w`) beats both, so that copy is kept too (in bf16, oneDNN wins there as well). fp32 stays fp32 (oneDNN's default math mode): outputs
match F.linear to float rounding. Builds of torch without oneDNN use the GEMV copy for every product, and so
does bf16 on a CPU where oneDNN has no bf16 path (AVX2 only: its reorder raises "bf16 path needs the cpu support
avx_ne_convert or avx512bw, avx512vl and avx512dq").
"""

from __future__ import annotations

import torch

_ONEDNN = torch.backends.mkldnn.is_available()


def onednn_takes(dtype: torch.dtype) -> bool:
    """Whether oneDNN can prepack and multiply weights of this dtype on this CPU."""
    if not _ONEDNN:
        return False
    return dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class Linear:
    """y = x @ weight.T for a fixed HF-layout weight [out_features, in_features], no bias.

    `input_major` may pass an existing [in, out] view of the same weight (an expert's slice of a
    stacked tensor), so that the GEMV copy costs no extra memory.
    """

    def __init__(self, weight: torch.Tensor, input_major: torch.Tensor | None = None):
        self.out_features, self.in_features = weight.shape
        self.input_major = weight.t().contiguous() if input_major is None else input_major
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous()) if onednn_takes(weight.dtype) \
            else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None or (x.numel() == self.in_features and x.dtype == torch.float32):
            return x @ self.input_major
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
