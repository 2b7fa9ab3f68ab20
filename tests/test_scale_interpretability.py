"""Tests for llmbook.scale.interpretability: ICL score, ablation effects, the hand-built circuit."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.scale.induction import (
    AttentionOnlyTransformer,
    per_position_loss,
    prefix_matching_score,
    previous_token_score,
    repeated_tokens,
)
from llmbook.scale.interpretability import (
    ablation_value,
    head_ablation_effects,
    icl_score,
    induction_circuit,
    induction_circuit_weights,
    repeat_mask,
)

pytestmark = pytest.mark.usefixtures("one_thread")
D = torch.float64


def test_icl_score_worked_example_and_bad_input():
    loss = torch.tensor([[4.0, 3.5, 1.0, 0.25], [2.0, 2.0, 2.0, 2.0]], dtype=D)
    assert icl_score(loss, 0, 3).tolist() == [-3.75, 0.0]
    assert icl_score(loss[0], 1, 2).item() == -2.5
    with pytest.raises(ValueError, match="late"):
        icl_score(loss, 0, 4)
    with pytest.raises(ValueError, match="before"):
        icl_score(loss, 2, 1)
    with pytest.raises(TypeError, match="floating"):
        icl_score(torch.tensor([1, 2]), 0, 1)


def test_repeat_mask():
    assert repeat_mask(3).tolist() == [False, False, False, True, True]
    with pytest.raises(ValueError, match="segment_length"):
        repeat_mask(0)


def test_ablation_effects_zero_for_an_unused_head_and_mean_value():
    model = AttentionOnlyTransformer(20, 16, 2, 2, 12, generator=gen(0)).double()
    with torch.no_grad():
        model.layers[1].o_proj.weight[:, 8:] = 0.0  # head 1 of layer 1 writes nothing
    ids = repeated_tokens(6, 6, 20, gen(1))
    for kind in ("zero", "mean"):
        eff = head_ablation_effects(model, ids, repeat_mask(6), kind)
        assert eff.shape == (2, 2)
        assert eff[1, 1] == 0.0 and (eff[0] != 0).all()
    # a (B, T-1) mask gives the same as the (T-1,) mask it broadcasts from
    mask2 = repeat_mask(6).expand(6, -1).clone()
    assert torch.equal(head_ablation_effects(model, ids, mask2), head_ablation_effects(model, ids, repeat_mask(6)))
    m = ablation_value(model, ids, 0, 1)
    _, cache = model.run_with_cache(ids)
    assert torch.allclose(m, cache["z"][0][:, 1].mean(0), atol=1e-15) and m.shape == (12, 8)
    with pytest.raises(ValueError, match="kind"):
        head_ablation_effects(model, ids, repeat_mask(6), "resample")
    with pytest.raises(ValueError, match="mask"):
        head_ablation_effects(model, ids, repeat_mask(5))


def test_induction_circuit_weights_layout():
    w = induction_circuit_weights(5, 7)
    d = 3 * 5 + 7
    assert w["W_E"].shape == (5, d) and w["W_P"].shape == (7, d) and w["W_Q0"].shape == (7, d)
    assert w["W_O1"].shape == (d, 7) and w["W_U"].shape == (5, d)
    assert set(torch.cat([v.flatten() for v in w.values()]).unique().tolist()) == {-1.0, 0.0, 1.0}
    # layer 0's positional score matrix is the sub-diagonal: [s = t - 1]
    S0 = w["W_P"] @ w["W_Q0"].T @ w["W_K0"] @ w["W_P"].T
    assert torch.equal(S0, torch.diag(torch.ones(6, dtype=D), -1))
    # the K-composition matrix W_QK^1 W_OV^0 on token one-hots is the identity
    kcomp = w["W_E"] @ w["W_Q1"].T @ w["W_K1"] @ w["W_O0"] @ w["W_V0"] @ w["W_E"].T
    assert torch.equal(kcomp, torch.eye(5, dtype=D))
    with pytest.raises(ValueError, match="seq_len"):
        induction_circuit_weights(5, 1)


@given(V=st.integers(4, 12), L=st.integers(2, 4), seed=st.integers(0, 50))
@settings(max_examples=15, deadline=None)
def test_induction_circuit_predicts_every_repeat(V, L, seed):
    L = min(L, V)
    ids = repeated_tokens(5, L, V, gen(seed), distinct=True)
    model = induction_circuit(V, 2 * L, beta=25.0)
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
    pred = logits[:, :-1].argmax(-1)
    assert (pred == ids[:, 1:])[:, repeat_mask(L)].all()
    assert float(per_position_loss(logits, ids)[:, repeat_mask(L)].max()) < 1e-6
    assert float(previous_token_score(cache["pattern"][0])[0]) > 1 - 1e-6
    assert float(prefix_matching_score(cache["pattern"][1], L)[0]) > 1 - 1e-6


def test_induction_circuit_loss_falls_with_beta():
    ids = repeated_tokens(20, 6, 10, gen(3), distinct=True)
    losses = []
    for beta in (2.0, 5.0, 10.0):
        with torch.no_grad():
            losses.append(float(per_position_loss(induction_circuit(10, 12, beta)(ids), ids)[:, repeat_mask(6)].mean()))
    assert losses[0] > losses[1] > losses[2] > 0
    assert losses[2] < 12 * math.exp(-10.0) * 2
    with pytest.raises(ValueError, match="beta"):
        induction_circuit(10, 12, beta=0.0)
