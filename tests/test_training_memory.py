"""Tests for llmbook.training.memory: float formats, bytes of a training step, saved activations."""

from __future__ import annotations

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.checkpoint import checkpoint

from llmbook.training import memory as M
from llmbook.training.optim import AdamW
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("e", "m", "dtype"), [(8, 23, torch.float32), (5, 10, torch.float16),
                                               (8, 7, torch.bfloat16), (11, 52, torch.float64)])
def test_float_format_matches_finfo(e: int, m: int, dtype: torch.dtype) -> None:
    f = M.float_format_symbolic(e, m)
    info = torch.finfo(dtype)
    assert float(f["max"]) == info.max
    assert float(f["min_normal"]) == info.tiny
    assert float(f["eps"]) == info.eps
    # the smallest subnormal is representable; half of it rounds to zero (ties to even)
    tiny = float(f["min_subnormal"])
    assert torch.tensor(tiny, dtype=dtype).item() == tiny
    assert torch.tensor(tiny / 2, dtype=dtype).item() == 0.0


def test_float_format_worked_example_float16() -> None:
    f = M.float_format_symbolic(5, 10)
    assert f["max"] == 65504
    assert f["min_normal"] == sp.Rational(1, 2**14)
    assert f["min_subnormal"] == sp.Rational(1, 2**24)
    assert f["eps"] == sp.Rational(1, 2**10)
    assert abs(float(f["digits"]) - 11 * 0.30103) < 1e-4


def test_float_format_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="exponent_bits"):
        M.float_format_symbolic(1, 3)
    with pytest.raises((ValueError, TypeError), match="mantissa_bits"):
        M.float_format_symbolic(5, 0)


@given(st.integers(2, 11), st.integers(1, 30))
@settings(max_examples=30, deadline=None)
def test_float_format_properties(e: int, m: int) -> None:
    f = M.float_format_symbolic(e, m)
    # the largest number is just under 2^(bias + 1); subnormals continue the normal spacing
    bias = 2 ** (e - 1) - 1
    assert f["max"] == sp.Integer(2) ** (bias + 1) * (1 - sp.Rational(1, 2 ** (m + 1)))
    assert f["min_subnormal"] * 2**m == f["min_normal"]
    assert f["eps"] == sp.Rational(1, 2**m)


def test_training_state_bytes_is_16_per_parameter_with_masters() -> None:
    model = nn.Sequential(nn.Linear(5, 3), nn.Linear(3, 2, bias=False)).to(torch.bfloat16)
    opt = M.MasterWeightOptimizer(model.parameters(), lambda ps: AdamW(ps, lr=1e-3))
    model(torch.randn(4, 5, dtype=torch.bfloat16)).float().pow(2).mean().backward()
    opt.step()
    got = M.training_state_bytes(model, opt.optimizer, opt.masters)
    n = 5 * 3 + 3 + 3 * 2  # 24 parameters in 3 tensors
    assert got["weights"] == 2 * n and got["gradients"] == 2 * n
    assert got["master weights"] == 4 * n and got["optimizer (per element)"] == 8 * n
    assert got["optimizer (scalars)"] == 3 * 4
    assert got["total"] == 16 * n + 12


def test_training_state_bytes_matches_torch_adamw_float32() -> None:
    model = nn.Linear(7, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert M.training_state_bytes(model, opt)["gradients"] == 0  # before backward: no grads
    model(torch.randn(2, 7)).sum().backward()
    opt.step()
    got = M.training_state_bytes(model, opt)
    n = 7 * 4 + 4
    assert got["total"] - got["optimizer (scalars)"] == 16 * n  # 4 + 4 + 4 + 4, no masters
    with pytest.raises(TypeError, match="model"):
        M.training_state_bytes("model", opt)
    with pytest.raises(TypeError, match="optimizer"):
        M.training_state_bytes(model, object())


def test_saved_activation_bytes_of_a_linear_layer() -> None:
    layer = nn.Linear(6, 5)
    x = torch.randn(3, 6, requires_grad=True)
    got = M.saved_activation_bytes(lambda: layer(x), exclude=layer.parameters())
    assert got == {"bytes": 3 * 6 * 4, "tensors": 1, "saves": 2}  # x (and the weight, excluded)
    # a tensor read by two operations is counted once
    got2 = M.saved_activation_bytes(lambda: (x * x.exp()).sum())
    assert got2["bytes"] == 2 * 3 * 6 * 4 and got2["saves"] > got2["tensors"]
    with pytest.raises(TypeError, match="fn"):
        M.saved_activation_bytes(layer(x))


@pytest.mark.parametrize(("b", "s", "h", "a"), [(2, 10, 24, 3), (1, 7, 40, 5), (3, 5, 16, 1)])
def test_activation_formula_matches_measurement(b: int, s: int, h: int, a: int) -> None:
    cfg = TransformerConfig.gpt2_style(vocab_size=11, d_model=h, n_layers=1, n_heads=a, max_seq_len=16)
    model = TransformerLM(cfg, generator=torch.Generator().manual_seed(0))
    model.set_fused_attention(False)
    x = torch.randn(b, s, h, requires_grad=True)
    got = M.saved_activation_bytes(lambda: model.blocks[0](x), exclude=model.parameters())
    f = M.activation_elements_per_layer_symbolic()
    sb, ss, sh, sa, sf = sp.symbols("b s h a f", positive=True, integer=True)
    subs = {sb: b, ss: s, sh: h, sa: a, sf: cfg.d_ff}
    assert got["bytes"] == 4 * f["floats"].subs(subs) + f["mask bytes"].subs(subs)
    # float64: every float term doubles, the boolean masks do not
    model.double()
    got64 = M.saved_activation_bytes(lambda: model.blocks[0](x.double()), exclude=model.parameters())
    assert got64["bytes"] == 8 * f["floats"].subs(subs) + f["mask bytes"].subs(subs) + 0 * b


def test_checkpointing_saves_less_and_gives_the_same_gradients() -> None:
    cfg = TransformerConfig.gpt2_style(vocab_size=11, d_model=16, n_layers=3, n_heads=2, max_seq_len=8)
    model = TransformerLM(cfg, generator=torch.Generator().manual_seed(0)).double()
    x0 = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)

    def run(ckpt: bool) -> torch.Tensor:
        x = x0
        for blk in model.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if ckpt else blk(x)
        return x.pow(2).sum()

    plain = M.saved_activation_bytes(lambda: run(False), exclude=model.parameters())["bytes"]
    ckpt = M.saved_activation_bytes(lambda: run(True), exclude=model.parameters())["bytes"]
    assert ckpt * 5 < plain
    grads = []
    for flag in (False, True):
        model.zero_grad()
        x0.grad = None
        run(flag).backward()
        grads.append([p.grad.clone() for p in model.blocks.parameters()] + [x0.grad.clone()])
    for g1, g2 in zip(*grads, strict=True):
        torch.testing.assert_close(g1, g2, rtol=0, atol=1e-12)


def test_scale_module_reexports_the_same_objects() -> None:
    from llmbook.scale import mixed_precision as S

    for name in S.__all__:
        assert getattr(S, name) is getattr(M, name)
