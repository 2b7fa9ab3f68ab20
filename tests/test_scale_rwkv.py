"""Tests for llmbook.scale.rwkv: token shift, the WKV operator (direct and stable recurrent),
and the RWKV-4 model against Hugging Face RwkvForCausalLM (CPU path)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import randn

from llmbook.scale.rwkv import (
    RWKVLM,
    RWKVBlock,
    RWKVChannelMixing,
    RWKVConfig,
    RWKVTimeMixing,
    rwkv_from_hf,
    token_shift,
    wkv_parallel,
    wkv_recurrent,
)

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64


def test_token_shift():
    x = torch.arange(12, dtype=D).reshape(1, 4, 3)
    assert token_shift(x).tolist() == [[[0, 0, 0], [0, 1, 2], [3, 4, 5], [6, 7, 8]]]
    with pytest.raises(ValueError, match="batch, T, d"):
        token_shift(randn(4, 3))


def test_wkv_worked_example():
    # w = ln 2 (weight halves per step), u = ln 3 (current token weighs 3x), k = 0:
    # t=0: v0;  t=1: (v0 + 3 v1) / 4;  t=2: (v0/2 + v1 + 3 v2) / (1/2 + 1 + 3)
    w, u = torch.tensor([math.log(2)], dtype=D), torch.tensor([math.log(3)], dtype=D)
    k, v = torch.zeros(1, 3, 1, dtype=D), torch.tensor([[[4.0], [8.0], [1.0]]], dtype=D)
    expected = torch.tensor([4.0, (4 + 24) / 4, (2 + 8 + 3) / 4.5], dtype=D)
    for wkv in (wkv_parallel, wkv_recurrent):
        assert torch.allclose(wkv(w, u, k, v)[0, :, 0], expected, atol=1e-14)


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 12), d=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_wkv_recurrent_equals_parallel(T, d, seed):
    w, u = torch.exp(randn(d, seed=seed)), randn(d, seed=seed + 1)
    k, v = 3 * randn(2, T, d, seed=seed + 2), randn(2, T, d, seed=seed + 3)
    assert torch.allclose(wkv_recurrent(w, u, k, v), wkv_parallel(w, u, k, v), atol=1e-12)


def test_wkv_recurrent_is_stable_where_the_formula_overflows():
    w, u = torch.ones(3, dtype=D), torch.zeros(3, dtype=D)
    k, v = 800 + randn(1, 6, 3, seed=1), randn(1, 6, 3, seed=2)
    assert not bool(wkv_parallel(w, u, k, v).isfinite().all())  # exp(800) = inf
    y = wkv_recurrent(w, u, k, v)
    # shifting every k by a constant multiplies numerator and denominator alike
    assert torch.allclose(y, wkv_parallel(w, u, k - 800, v), atol=1e-12)


def test_wkv_state_continues_the_sequence():
    w, u = torch.exp(randn(4, seed=3)), randn(4, seed=4)
    k, v = randn(2, 8, 4, seed=5), randn(2, 8, 4, seed=6)
    _, (a, b, p) = wkv_recurrent(w, u, k, v, return_state=True)
    # a / b with the common factor e^p: the decayed average of all 8 values, no bonus
    weights = torch.exp(-(7 - torch.arange(8, dtype=D))[:, None] * w + k)  # (batch, 8, d)
    assert torch.allclose(a / b, (weights * v).sum(1) / weights.sum(1), atol=1e-12)
    assert torch.allclose(b * torch.exp(p), weights.sum(1), atol=1e-12)


def test_wkv_gradcheck():
    args = [torch.exp(randn(2, seed=7)), randn(2, seed=8), randn(1, 4, 2, seed=9), randn(1, 4, 2, seed=10)]
    assert torch.autograd.gradcheck(wkv_recurrent, [a.requires_grad_() for a in args])


def test_wkv_bad_input():
    w, u, k = randn(3), randn(3), randn(2, 5, 3)
    with pytest.raises(ValueError, match="same shape"):
        wkv_recurrent(w, u, k, randn(2, 4, 3))
    with pytest.raises(ValueError, match="w and u"):
        wkv_parallel(randn(4), u, k, k)
    with pytest.raises(TypeError, match="floating-point"):
        wkv_recurrent(w, u, k.long(), k)


def test_blocks_are_causal_with_non_square_ffn():
    torch.manual_seed(0)
    cfg = RWKVConfig(vocab_size=20, d_model=8, n_layers=2, d_ff=12)
    block = RWKVBlock(cfg, first=True).double()
    for m in (block, RWKVTimeMixing(8).double(), RWKVChannelMixing(8, 12).double()):
        x = randn(2, 7, 8, seed=1)
        x2 = x.clone()
        x2[:, 4:] += randn(2, 3, 8, seed=2)
        with torch.no_grad():
            assert torch.allclose(m(x)[:, :4], m(x2)[:, :4], atol=1e-14)
            assert not torch.allclose(m(x)[:, 4:], m(x2)[:, 4:])
    assert RWKVConfig(vocab_size=5, d_model=6).d_ff == 24
    with pytest.raises(ValueError, match="n_layers"):
        RWKVConfig(vocab_size=5, n_layers=0)
    with pytest.raises(TypeError, match="integer"):
        RWKVLM(cfg)(torch.zeros(1, 3))


@pytest.fixture(scope="module")
def hf_rwkv():
    transformers = pytest.importorskip("transformers")
    from llmbook.transformer.hf_loading import randomize_parameters_

    torch.manual_seed(0)
    cfg = transformers.RwkvConfig(vocab_size=50, hidden_size=24, num_hidden_layers=3, intermediate_size=40,
                                  attention_hidden_size=24, rescale_every=0, context_length=64)
    hf = transformers.RwkvForCausalLM(cfg)
    randomize_parameters_(hf, 0.1, torch.Generator().manual_seed(1))
    return hf


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rwkv_matches_hugging_face(hf_rwkv, dtype):
    hf = hf_rwkv.to(dtype).eval()
    ours = rwkv_from_hf(hf).eval()
    ids = torch.randint(0, 50, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected, got = hf(ids).logits, ours(ids)
    # Hugging Face's CPU wkv rounds k to float32 even in float64
    assert float((expected.double() - got.double()).abs().max()) < 5e-6
    assert float(expected.abs().max()) > 1.0


def test_rwkv_from_hf_rejects_unsupported_models():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.RwkvConfig(vocab_size=20, hidden_size=8, num_hidden_layers=2, intermediate_size=16,
                                  attention_hidden_size=16, rescale_every=0, context_length=16)
    with pytest.raises(ValueError, match="attention_hidden_size"):
        rwkv_from_hf(transformers.RwkvForCausalLM(cfg))
