"""Tests for llmbook.validation: the argument checks the whole package shares."""

import numpy as np
import pytest
import torch

from llmbook.validation import check_floating_tensor, check_positive_int


def test_check_positive_int_accepts_ints_and_numpy_ints():
    assert check_positive_int("d_model", 64) == 64
    assert check_positive_int("d_model", np.int64(3)) == 3
    assert type(check_positive_int("d_model", np.int32(3))) is int


@pytest.mark.parametrize(("value", "error", "match"), [
    (0, ValueError, "d_model must be positive, got d_model=0"),
    (-2, ValueError, "must be positive"),
    (True, TypeError, "d_model must be an int, got True"),
    (2.0, TypeError, "must be an int, got 2.0"),
    ("8", TypeError, "must be an int"),
])
def test_check_positive_int_rejects(value, error, match):
    with pytest.raises(error, match=match):
        check_positive_int("d_model", value)


def test_check_floating_tensor():
    x = torch.zeros(2, 3, dtype=torch.float64)
    assert check_floating_tensor(x, "logits") is x
    with pytest.raises(TypeError, match="logits must be a torch.Tensor, got list"):
        check_floating_tensor([1.0], "logits")
    with pytest.raises(TypeError, match="logits must be a floating-point tensor, got dtype torch.int64"):
        check_floating_tensor(torch.zeros(2, dtype=torch.long), "logits")
