"""The prepacked projection computes F.linear, for every row count the engine sends it."""

import pytest
import torch
import torch.nn.functional as F

from workflow_scripts.engine.linear import Linear


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", [(1, 48), (1, 1, 48), (3, 48), (2, 3, 48), (64, 48)])
def test_matches_f_linear(shape, dtype, tol):
    g = torch.Generator().manual_seed(len(shape) * 100 + shape[0])
    weight = torch.randn(40, 48, generator=g).to(dtype)
    x = torch.randn(shape, generator=g).to(dtype)
    got = Linear(weight)(x)
    assert got.shape == (*shape[:-1], 40) and got.dtype == dtype
    torch.testing.assert_close(got.float(), F.linear(x.float(), weight.float()), atol=tol * 10, rtol=tol)


def test_shared_input_major_view_is_used_not_copied():
    weight = torch.randn(8, 4)
    stacked = weight.t().contiguous()[None]
    lin = Linear(weight, input_major=stacked[0])
    assert lin.input_major.data_ptr() == stacked.data_ptr()
    torch.testing.assert_close(lin(torch.ones(1, 4)), F.linear(torch.ones(1, 4), weight))
