"""Tests for llmbook.validation: the argument checks the whole package shares."""

import numpy as np
import pytest
import torch

from llmbook.validation import (
    check_array,
    check_floating_tensor,
    check_positive_int,
    check_positive_number,
    check_probability,
    check_token_ids,
)


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


def test_check_positive_number():
    assert check_positive_number("beta", 0.1) == 0.1
    assert check_positive_number("beta", 3) == 3.0 and type(check_positive_number("beta", 3)) is float
    assert check_positive_number("beta", np.float32(0.5)) == 0.5
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="beta must be a positive finite number, got beta="):
            check_positive_number("beta", bad)
    for bad in (True, "0.1", None, torch.tensor(0.1)):
        with pytest.raises(TypeError, match="beta must be a number"):
            check_positive_number("beta", bad)


def test_check_token_ids():
    ids = torch.zeros(2, 3, dtype=torch.long)
    assert check_token_ids(ids, "ids") is ids
    assert check_token_ids(ids.int(), "ids", ndim=2) is not None
    assert check_token_ids(ids.to(torch.int16)[0], "ids", ndim=1).shape == (3,)
    with pytest.raises(ValueError, match="ids must be 1-d \\(have 1 dimensions\\), got shape \\(2, 3\\)"):
        check_token_ids(ids, "ids", ndim=1)
    for bad in (ids.float(), ids.bool(), ids.to(torch.complex64)):
        with pytest.raises(TypeError, match="ids must be an integer tensor of token ids, got dtype"):
            check_token_ids(bad, "ids")
    with pytest.raises(TypeError, match="ids must be an integer torch.Tensor of token ids, got list"):
        check_token_ids([[0, 1]], "ids")
    assert check_token_ids(ids, "ids", vocab_size=1) is ids
    for bad in (-1, 5):
        with pytest.raises(ValueError, match=rf"ids must hold token ids in \[0, 5\), found {bad}"):
            check_token_ids(torch.tensor([0, bad]), "ids", vocab_size=5)


def test_check_probability():
    assert check_probability("min_p", 0) == 0.0 and check_probability("p", np.float32(0.25)) == 0.25
    assert check_probability("top_p", 1, allow_zero=False) == 1.0
    with pytest.raises(ValueError, match=r"top_p must lie in \(0, 1\], got top_p=0"):
        check_probability("top_p", 0, allow_zero=False)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"min_p must lie in \[0, 1\]"):
            check_probability("min_p", bad)
    for bad in (True, "0.5", None):
        with pytest.raises(TypeError, match="p must be a number"):
            check_probability("p", bad)


def test_check_nonnegative_number():
    from llmbook.validation import check_nonnegative_number

    assert check_nonnegative_number("latency", 0) == 0.0 and check_nonnegative_number("alpha", 2) == 2.0
    for bad in (-1e-9, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="latency must be a finite number >= 0, got latency="):
            check_nonnegative_number("latency", bad)
    for bad in (True, "1", None):
        with pytest.raises(TypeError, match="latency must be a number"):
            check_nonnegative_number("latency", bad)


def test_check_index():
    from llmbook.validation import check_index

    assert check_index("rank", 0, 2) == 0 and type(check_index("rank", np.int64(1), 2)) is int
    for bad in (-1, 2):
        with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\), got rank="):
            check_index("rank", bad, 2)
    for bad in (True, 1.0, "0"):
        with pytest.raises(TypeError, match="rank must be an int"):
            check_index("rank", bad, 2)


def test_check_finite():
    from llmbook.validation import check_finite

    x = torch.tensor([[0.0, 1.0], [float("-inf"), 2.0]])
    assert check_finite(x, "logp", allow_inf=True) is x
    with pytest.raises(ValueError, match=r"logp must not hold NaN or inf; logp\[1, 0\] = -inf"):
        check_finite(x, "logp")
    with pytest.raises(ValueError, match=r"logp must not hold NaN; logp\[0, 1\] = nan"):
        check_finite(torch.tensor([[0.0, float("nan")]]), "logp", allow_inf=True)
    with pytest.raises(ValueError, match=r"r must not hold NaN or inf; r\[\] = nan"):
        check_finite(torch.tensor(float("nan")), "r")


def test_check_nonempty_and_same_dtype():
    from llmbook.validation import check_nonempty, check_same_dtype

    x = torch.zeros(2, 3)
    assert check_nonempty(x, "q") is x and check_same_dtype(x, "k", x, "q") is x
    with pytest.raises(ValueError, match=r"q is empty \(shape \(2, 0\)\)"):
        check_nonempty(torch.zeros(2, 0), "q")
    with pytest.raises(TypeError, match="k must have the dtype of q, torch.float32, got torch.float64"):
        check_same_dtype(x.double(), "k", x, "q")


def test_check_sequence():
    from llmbook.validation import check_sequence

    w = torch.zeros(4, 8)
    x = torch.zeros(2, 3, 8)
    assert check_sequence(x, "h", 8, w) is x
    for bad in (torch.zeros(2, 3, 5), torch.zeros(3, 8), torch.zeros(2, 0, 8)):
        with pytest.raises(ValueError, match=r"h must have shape \(batch, T, d_model\) = \(batch, T, 8\) with T >= 1"):
            check_sequence(bad, "h", 8, w)
    with pytest.raises(TypeError, match="h must have the dtype of the layer's weights, torch.float32, got torch.float64"):
        check_sequence(x.double(), "h", 8, w)
    with pytest.raises(TypeError, match="h must be a floating-point tensor"):
        check_sequence(x.long(), "h", 8, w)


def test_check_keys():
    from llmbook.validation import check_keys

    spec = {"seed": 0, "lr": 0.1}
    assert check_keys(spec, "spec", ("seed", "lr")) is spec
    with pytest.raises(ValueError, match=r"spec is missing the key\(s\) \['steps'\]: it needs \['seed', 'steps'\], "
                                         r"got \['seed', 'lr'\]"):
        check_keys(spec, "spec", ("seed", "steps"))
    with pytest.raises(TypeError, match="spec must be a dict, got list"):
        check_keys([1], "spec", ("seed",))


def test_check_array_accepts_lists_tuples_arrays_and_tensors():
    for values in ([1, 2.5], (1, 2.5), np.array([1, 2.5]), torch.tensor([1.0, 2.5])):
        arr = check_array("x", values)
        assert arr.dtype == np.float64 and arr.tolist() == [1.0, 2.5]
    grid = check_array("m", [[1, 2, 3], [4, 5, 6]], ndim=2)
    assert grid.shape == (2, 3)
    assert check_array("w", [0, 1], sign="nonnegative").tolist() == [0.0, 1.0]


def test_check_array_names_what_is_wrong():
    with pytest.raises(TypeError, match="x must be a sequence of numbers, got str"):
        check_array("x", "12")
    with pytest.raises(TypeError, match="x must be a sequence of numbers, got float"):
        check_array("x", 1.0)
    with pytest.raises(TypeError, match="x must hold numbers"):
        check_array("x", [1, "a"])
    with pytest.raises(ValueError, match=r"x must be 2-D, got shape \(3,\)"):
        check_array("x", [1, 2, 3], ndim=2)
    with pytest.raises(ValueError, match="x must be a non-empty 1-D sequence"):
        check_array("x", [])
    with pytest.raises(ValueError, match="x must be finite"):
        check_array("x", [1.0, float("nan")])
    with pytest.raises(ValueError, match="x must be positive"):
        check_array("x", [1.0, 0.0], sign="positive")
    with pytest.raises(ValueError, match="x must be non-negative"):
        check_array("x", [1.0, -1e-300], sign="nonnegative")
    with pytest.raises(ValueError, match="sign must be"):
        check_array("x", [1.0], sign="negative")
