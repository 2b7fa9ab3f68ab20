"""Tests for llmbook.scale.moe: routing, balancing losses, capacity, the MoE layer and its peers.

Worked examples with numbers computed by hand, hypothesis properties, float64 gradient
checks of the hand-derived gradients, and peer tests against Hugging Face transformers'
MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, DeepseekV3MoE and load_balancing_loss_func
(which compute the router probabilities in float32, hence tolerances of 1e-6 in float64).
"""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.scale.moe import (
    MoELayer,
    all_to_all_bytes,
    capacity_keep_mask,
    expected_drop_fraction,
    expert_capacity,
    expert_load_fractions,
    from_hf_moe_block,
    gate_jacobian_symbolic,
    lm_router_gradients,
    load_balancing_loss,
    route,
    router_gradient,
    router_z_loss,
    update_expert_bias,
)
from llmbook.transformer.layers import SwiGLU

pytestmark = pytest.mark.usefixtures("one_thread")
f64 = torch.float64


# ---------------------------------------------------------------- route


def test_route_worked_example_softmax_top2():
    z = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=f64))  # softmax = (.1, .2, .3, .4)
    r = route(z, 2)
    assert r.indices.tolist() == [[3, 2]]
    torch.testing.assert_close(r.weights, torch.tensor([[4 / 7, 3 / 7]], dtype=f64))
    torch.testing.assert_close(r.scores, torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=f64))
    raw = route(z, 2, normalize=False, scaling=2.0)
    torch.testing.assert_close(raw.weights, torch.tensor([[0.8, 0.6]], dtype=f64))


def test_route_bias_changes_selection_not_gates():
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=f64)
    s = torch.sigmoid(z)
    plain = route(z, 2, score="sigmoid")
    biased = route(z, 2, score="sigmoid", bias=torch.tensor([0.0, 0.0, 0.5, 0.0], dtype=f64))
    assert plain.indices.tolist() == [[0, 1]] and biased.indices.tolist() == [[2, 0]]  # s + b = (.88, .73, 1.0, .27)
    # the gates come from the unbiased scores of the selected experts
    torch.testing.assert_close(biased.weights, s[:, [2, 0]] / s[:, [2, 0]].sum(), rtol=0, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 9), n_experts=st.integers(2, 7), data=st.data())
def test_route_properties(n, n_experts, data):
    k = data.draw(st.integers(1, n_experts))
    z = torch.randn(n, n_experts, generator=gen(n * 31 + n_experts), dtype=f64)
    r = route(z, k)
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(n, dtype=f64))
    assert all(len(set(row)) == k for row in r.indices.tolist())  # k distinct experts
    # the selected scores are the k largest
    top = torch.sort(r.scores, dim=-1, descending=True).values[:, :k]
    torch.testing.assert_close(r.scores.gather(1, r.indices), top, rtol=0, atol=0)


def test_route_bad_inputs():
    z = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="top_k=5 exceeds"):
        route(z, 5)
    with pytest.raises(ValueError, match="unknown score"):
        route(z, 1, score="relu")
    with pytest.raises(ValueError, match="bias must have shape"):
        route(z, 1, bias=torch.zeros(3))
    with pytest.raises(ValueError, match="n_tokens, num_experts"):
        route(torch.zeros(4), 1)
    with pytest.raises(TypeError, match="floating-point"):
        route(torch.zeros(3, 4, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="top_k must be positive"):
        route(z, 0)


# ---------------------------------------------------------------- balancing losses


def test_expert_load_fractions_example_and_errors():
    f = expert_load_fractions(torch.tensor([[0, 1], [0, 2], [0, 1]]), 4)
    assert f.tolist() == [3 / 6, 2 / 6, 1 / 6, 0.0]
    with pytest.raises(ValueError, match=r"lie in \[0, 3\]"):
        expert_load_fractions(torch.tensor([[4]]), 4)
    with pytest.raises(TypeError, match="integer"):
        expert_load_fractions(torch.tensor([[0.0]]), 4)


def test_load_balancing_loss_worked_examples():
    # two tokens both sent to expert 0 with P = (3/4, 1/4): N f . P = 2 * 3/4
    z = torch.log(torch.tensor([[3.0, 1.0], [3.0, 1.0]], dtype=f64))
    assert float(load_balancing_loss(z, 1)) == pytest.approx(1.5, abs=1e-15)
    assert float(load_balancing_loss(z, 1, alpha=0.01)) == pytest.approx(0.015, abs=1e-15)
    # perfectly uniform routing: every cyclic shift of a vector once -> f = P = 1/N, loss = alpha
    v = torch.tensor([2.0, 0.5, -1.0, 0.0, 1.0], dtype=f64)
    z = torch.stack([v.roll(i) for i in range(5)])
    for k in (1, 2, 3):
        assert float(load_balancing_loss(z, k, alpha=0.3)) == pytest.approx(0.3, abs=1e-15)


def test_load_balancing_loss_gradient_is_the_derived_one():
    z = torch.randn(7, 5, generator=gen(0), dtype=f64, requires_grad=True)
    alpha, k = 0.7, 2
    load_balancing_loss(z, k, alpha=alpha).backward()
    s = torch.softmax(z.detach(), -1)
    f = expert_load_fractions(route(z.detach(), k).indices, 5)
    # d/dz_tj of (alpha N / n) sum_i f_i s_ti = (alpha N / n) s_tj (f_j - sum_i f_i s_ti)
    expected = alpha * 5 / 7 * s * (f - (s * f).sum(-1, keepdim=True))
    torch.testing.assert_close(z.grad, expected, rtol=0, atol=1e-15)
    assert torch.autograd.gradcheck(lambda t: load_balancing_loss(t, k), (z.detach().requires_grad_(),))


def test_load_balancing_loss_equals_transformers():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    layers = tuple(torch.randn(13, 6, generator=gen(i), dtype=f64) for i in range(3))
    for k in (1, 2, 3):
        hf = load_balancing_loss_func(layers, 6, k)
        ours = k * load_balancing_loss(torch.cat(layers), k)
        assert abs(float(hf) - float(ours)) < 1e-6


def test_router_z_loss_example_gradient_and_errors():
    z = torch.zeros(3, 4, dtype=f64)
    assert float(router_z_loss(z)) == pytest.approx(math.log(4) ** 2, abs=1e-15)
    z = torch.randn(5, 3, generator=gen(1), dtype=f64, requires_grad=True)
    router_z_loss(z).backward()
    lse = torch.logsumexp(z.detach(), -1, keepdim=True)
    torch.testing.assert_close(z.grad, 2 * lse * torch.softmax(z.detach(), -1) / 5, rtol=0, atol=1e-15)
    # shifting all logits by c leaves the router's softmax alone but changes the z-loss
    assert float(router_z_loss(z.detach() + 3)) > float(router_z_loss(z.detach()))
    with pytest.raises(ValueError, match="no tokens"):
        router_z_loss(torch.zeros(0, 3))


# ---------------------------------------------------------------- capacity


def test_expert_capacity_examples_and_errors():
    assert expert_capacity(10, 4, 2, 1.0) == 5
    assert expert_capacity(10, 4, 2, 1.25) == 7  # ceil(6.25)
    assert expert_capacity(10, 1, 1, 1.1) == 11  # 1.1 read as 11/10, not 1.1000000000000000888
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(10, 4, 2, 0.0)
    with pytest.raises(ValueError, match="top_k=3 exceeds"):
        expert_capacity(10, 2, 3, 1.0)


def test_capacity_keep_mask_worked_example():
    idx = torch.tensor([[0, 1], [0, 2], [0, 1]])
    keep = capacity_keep_mask(idx, 3, 2)
    # slot-major: the three first choices of expert 0 come first; the third is dropped
    assert keep.tolist() == [[True, True], [True, True], [False, True]]
    assert capacity_keep_mask(idx, 3, 0).sum() == 0
    with pytest.raises(ValueError, match="capacity must be"):
        capacity_keep_mask(idx, 3, -1)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 30), n_experts=st.integers(1, 6), cap=st.integers(0, 12), seed=st.integers(0, 99))
def test_capacity_keep_mask_properties(n, n_experts, cap, seed):
    k = min(2, n_experts)
    idx = torch.rand(n, n_experts, generator=gen(seed)).topk(k, -1).indices
    keep = capacity_keep_mask(idx, n_experts, cap)
    load = torch.bincount(idx.reshape(-1), minlength=n_experts)
    kept = torch.bincount(idx[keep], minlength=n_experts)
    assert torch.equal(kept, load.clamp(max=cap))  # an expert keeps min(load, capacity)
    # first choices are never dropped while a second choice to the same expert is kept
    for e in range(n_experts):
        first_dropped = ((idx[:, 0] == e) & ~keep[:, 0]).any()
        later_kept = ((idx[:, 1:] == e) & keep[:, 1:]).any()
        assert not (first_dropped and later_kept)


def test_expected_drop_fraction_exact_small_cases():
    assert expected_drop_fraction(2, 2, 1, 1) == pytest.approx(0.25, abs=1e-15)  # both tokens collide: 1/2 * 1/2
    assert expected_drop_fraction(3, 3, 3, 1) == pytest.approx(2 / 3, abs=1e-15)  # k = N: load n always
    assert expected_drop_fraction(8, 4, 2, 8) == 0.0
    # against an exact rational sum
    n, N, k, c = 12, 4, 2, 5
    p = Fraction(k, N)
    exact = sum(Fraction(math.comb(n, x)) * p**x * (1 - p) ** (n - x) * (x - c) for x in range(c + 1, n + 1))
    assert expected_drop_fraction(n, N, k, c) == pytest.approx(float(N * exact / (n * k)), rel=1e-13)


def test_expected_drop_fraction_matches_simulation():
    n, N, k, trials = 64, 8, 2, 4000
    c = expert_capacity(n, N, k, 1.0)
    idx = torch.rand(trials * n, N, generator=gen(3)).topk(k, -1).indices.reshape(trials, n, k)
    per_trial = torch.stack([~capacity_keep_mask(i, N, c) for i in idx]).double().mean((1, 2))
    se = float(per_trial.std()) / math.sqrt(trials)  # about 4e-4; capacity c -+ 1 moves it by 3e-2
    assert float(per_trial.mean()) == pytest.approx(expected_drop_fraction(n, N, k, c), abs=5 * se)


# ---------------------------------------------------------------- bias and traffic


def test_update_expert_bias_example_and_errors():
    b = update_expert_bias(torch.zeros(4, dtype=f64), torch.tensor([5, 1, 3, 3]), 0.1)
    assert b.tolist() == [-0.1, 0.1, 0.0, 0.0]
    with pytest.raises(ValueError, match="counts must be"):
        update_expert_bias(torch.zeros(4), torch.zeros(3), 0.1)
    with pytest.raises(ValueError, match="rate"):
        update_expert_bias(torch.zeros(4), torch.zeros(4), -1.0)


def test_all_to_all_bytes():
    # Mixtral 8x7B: d = 4096, top-2, bf16: 2 * 2 * 4096 * 2 = 32768 bytes per token and layer
    assert all_to_all_bytes(1, 4096, 2, 2) == 32768
    assert all_to_all_bytes(10, 3, 1, 4, ep_size=4) == 2 * 10 * 3 * 4 * 3 / 4
    assert all_to_all_bytes(10, 3, 1, 4, ep_size=1) == 0
    with pytest.raises(ValueError, match="ep_size"):
        all_to_all_bytes(10, 3, ep_size=0)


# ---------------------------------------------------------------- the layer


def reference_moe(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Token by token: y = sum_{i in top-k} g_i E_i(x) (+ the shared expert)."""
    rows = []
    for h in x.reshape(-1, layer.d_model):
        s = torch.softmax(layer.router(h), -1)
        top = torch.topk(s, layer.top_k)
        g = top.values / top.values.sum()
        y = sum(g[j] * layer.experts[int(i)](h) for j, i in enumerate(top.indices))
        if layer.shared_expert is not None:
            y = y + layer.shared_expert(h)
        rows.append(y)
    return torch.stack(rows).reshape(x.shape)


def make_layer(seed=0, **kw) -> MoELayer:
    torch.manual_seed(seed)
    layer = MoELayer(6, 10, 5, kw.pop("top_k", 2), dtype=f64, **kw)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5, generator=gen(seed + p.numel()))
    return layer


def test_layer_equals_token_by_token_reference():
    for kw in ({}, {"shared_d_ff": 7}, {"top_k": 1}, {"top_k": 5}):
        layer = make_layer(**kw)
        x = torch.randn(3, 4, 6, generator=gen(1), dtype=f64)
        torch.testing.assert_close(layer(x), reference_moe(layer, x), rtol=0, atol=1e-14)
        assert layer.router_logits.shape == (12, 5) and layer.expert_indices.shape == (12, layer.top_k)


def test_single_expert_is_swiglu():
    layer = MoELayer(6, 9, 1, 1, dtype=f64)
    swiglu = SwiGLU(6, 9, dtype=f64)
    swiglu.load_state_dict({k.removeprefix("experts.0."): v for k, v in layer.state_dict().items()
                            if k.startswith("experts.0.")})
    x = torch.randn(4, 6, generator=gen(2), dtype=f64)
    torch.testing.assert_close(layer(x), swiglu(x), rtol=0, atol=0)


def test_capacity_drops_tokens_in_the_layer():
    layer = make_layer()
    x = torch.randn(40, 6, generator=gen(4), dtype=f64)
    full = layer(x)
    layer.capacity_factor = 100.0
    torch.testing.assert_close(layer(x), full, rtol=0, atol=0)
    assert layer.dropped_fraction() == 0.0
    layer.capacity_factor = 0.5
    out = layer(x)
    assert layer.dropped_fraction() >= 0.5  # at most half of the assignments fit
    all_dropped = ~layer.keep.any(-1)
    assert all_dropped.any()
    assert torch.equal(out[all_dropped], torch.zeros_like(out[all_dropped]))


def test_layer_gradient_reaches_router_and_experts():
    layer = make_layer()
    x = torch.randn(5, 6, generator=gen(5), dtype=f64)
    w = layer.router.weight.detach().clone().requires_grad_()

    layer(x).sum().backward()
    assert layer.router.weight.grad.abs().sum() > 0
    assert layer.experts[int(layer.expert_indices[0, 0])].up_proj.weight.grad.abs().sum() > 0
    # the selection is locally constant, so the layer is smooth in the router weights
    assert torch.autograd.gradcheck(lambda t: torch.func.functional_call(layer, {"router.weight": t}, (x,)), (w,))


def test_layer_bad_inputs():
    with pytest.raises(ValueError, match="top_k=6 exceeds"):
        MoELayer(4, 8, 5, 6)
    with pytest.raises(ValueError, match="needs a shared expert"):
        MoELayer(4, 8, 5, 2, shared_expert_gate=True)
    with pytest.raises(ValueError, match="capacity_factor"):
        MoELayer(4, 8, 5, 2, capacity_factor=-1.0)
    layer = MoELayer(4, 8, 5, 2)
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        layer(torch.zeros(3, 5))
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="not been called"):
        layer.dropped_fraction()


# ---------------------------------------------------------------- peers


def randomize(block, seed):
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen(seed + p.numel())))
    return block.double().eval()


def test_mixtral_block_peer():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=12, intermediate_size=20, num_local_experts=6, num_experts_per_tok=2)
    hf = randomize(MixtralSparseMoeBlock(cfg), 0)
    ours = from_hf_moe_block(hf, cfg)
    x = torch.randn(3, 7, 12, generator=gen(1), dtype=f64)
    with torch.no_grad():
        y_hf, (logits, _, idx) = hf(x), hf.gate(x)
        y = ours(x)
    assert (y - y_hf).abs().max() < 1e-6  # HF's softmax runs in float32
    assert torch.equal(ours.router_logits, logits) and torch.equal(ours.expert_indices, idx)


def test_qwen2_moe_block_peer():
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    for norm in (False, True):
        cfg = Qwen2MoeConfig(hidden_size=12, moe_intermediate_size=20, shared_expert_intermediate_size=28,
                             num_experts=6, num_experts_per_tok=2, norm_topk_prob=norm)
        hf = randomize(Qwen2MoeSparseMoeBlock(cfg), 2)
        ours = from_hf_moe_block(hf, cfg)
        x = torch.randn(2, 5, 12, generator=gen(3), dtype=f64)
        with torch.no_grad():
            assert (ours(x) - hf(x)).abs().max() < 1e-6


def test_deepseek_v3_block_peer_with_bias():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = DeepseekV3Config(hidden_size=12, moe_intermediate_size=20, n_shared_experts=2, n_routed_experts=8,
                           num_experts_per_tok=3, n_group=1, topk_group=1, routed_scaling_factor=2.5)
    cfg._experts_implementation = "eager"
    hf = randomize(DeepseekV3MoE(cfg), 4)
    with torch.no_grad():
        hf.gate.e_score_correction_bias.copy_(0.3 * torch.randn(8, generator=gen(5)))
    ours = from_hf_moe_block(hf, cfg)
    x = torch.randn(2, 5, 12, generator=gen(6), dtype=f64)
    with torch.no_grad():
        assert (ours(x) - hf(x)).abs().max() < 1e-5
        _, _, idx = hf.gate(x)
    assert sorted(map(sorted, idx.tolist())) == sorted(map(sorted, ours.expert_indices.tolist()))


def test_from_hf_moe_block_rejects_unknown_blocks():
    with pytest.raises(TypeError, match="does not know Linear"):
        from_hf_moe_block(torch.nn.Linear(2, 2), None)


# ---------------------------------------------------------------- the router's gradient (issue 25)


def test_gate_jacobian_symbolic_top1_renormalised_is_zero():
    import sympy as sp

    assert gate_jacobian_symbolic(3, 1) == sp.zeros(1, 3)
    assert gate_jacobian_symbolic(4, 1, "sigmoid") == sp.zeros(1, 4)
    z = sp.symbols("z0:3", real=True)
    # without renormalisation: the softmax's own derivative s_0 (delta_0j - s_j), written out here
    s = [sp.exp(v) / sum(sp.exp(w) for w in z) for v in z]
    expected = sp.Matrix([[s[0] * ((1 if j == 0 else 0) - s[j]) for j in range(3)]])
    assert sp.simplify(gate_jacobian_symbolic(3, 1, normalize=False) - expected) == sp.zeros(1, 3)
    # top-2 renormalised: a two-way softmax of z0, z1; nothing reaches the unselected z2
    jac = gate_jacobian_symbolic(3, 2)
    assert jac[:, 2] == sp.zeros(2, 1) and jac[0, 0] != 0
    at = {z[0]: 0.7, z[1]: -0.4, z[2]: 2.0}
    sig = 1 / (1 + math.exp(-(0.7 + 0.4)))  # sigma(z0 - z1) and its derivative sigma (1 - sigma)
    assert float(jac[0, 0].subs(at)) == pytest.approx(sig * (1 - sig), rel=1e-12)
    with pytest.raises(ValueError, match="score"):
        gate_jacobian_symbolic(3, 1, "relu")
    with pytest.raises(TypeError, match="normalize"):
        gate_jacobian_symbolic(3, 1, normalize=1)


@pytest.mark.parametrize("k, normalize, score, zero", [(1, True, "softmax", True), (1, True, "sigmoid", True),
                                                       (1, False, "softmax", False), (2, True, "softmax", False),
                                                       (1, False, "sigmoid", False)])
def test_router_gradient_zero_exactly_for_renormalised_top1(k, normalize, score, zero):
    torch.manual_seed(0)
    layer = MoELayer(6, 5, 4, k, normalize=normalize, score=score, dtype=f64)
    x = torch.randn(3, 7, 6, generator=gen(2), dtype=f64)
    go = torch.randn(3, 7, 6, generator=gen(3), dtype=f64)
    grad = router_gradient(layer, x, go)
    assert grad.shape == (4, 6)
    if zero:
        assert grad.abs().max() < 1e-15
    else:
        assert grad.abs().max() > 1e-3
        # independent: central differences of <y, go> in one router weight
        w = layer.router.weight
        with torch.no_grad():
            w[1, 2] += 1e-6
            up = (layer(x) * go).sum()
            w[1, 2] -= 2e-6
            down = (layer(x) * go).sum()
            w[1, 2] += 1e-6
        assert float(grad[1, 2]) == pytest.approx(float(up - down) / 2e-6, abs=1e-7)


def test_router_gradient_from_the_balancing_loss_is_not_zero():
    layer = MoELayer(6, 5, 4, 1, dtype=f64)
    x = torch.randn(20, 6, generator=gen(4), dtype=f64)
    layer(x)
    (aux,) = torch.autograd.grad(load_balancing_loss(layer.router_logits, 1), layer.router.weight)
    assert aux.abs().max() > 1e-3


def test_router_gradient_mixtral_top1_peer_is_zero_too():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=12, intermediate_size=20, num_local_experts=5, num_experts_per_tok=1)
    hf = randomize(MixtralSparseMoeBlock(cfg), 5)
    x = torch.randn(2, 6, 12, generator=gen(6), dtype=f64)
    go = torch.randn(2, 6, 12, generator=gen(7), dtype=f64)
    y = hf(x)
    y = y[0] if isinstance(y, tuple) else y
    (peer,) = torch.autograd.grad(y, hf.gate.weight, go, allow_unused=True, materialize_grads=True)
    ours = router_gradient(from_hf_moe_block(hf, cfg), x, go)
    assert peer.abs().max() < 1e-6 and ours.abs().max() < 1e-15


def test_router_gradient_bad_inputs():
    layer = MoELayer(6, 5, 4, 1, dtype=f64)
    x = torch.randn(3, 6, dtype=f64)
    with pytest.raises(TypeError, match="layer"):
        router_gradient(torch.nn.Linear(6, 6), x, x)
    with pytest.raises(ValueError, match="grad_output"):
        router_gradient(layer, x, torch.randn(2, 6, dtype=f64))


def _tiny_moe_lm():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Embedding(11, 6, dtype=f64), MoELayer(6, 5, 4, 2, dtype=f64),
                               MoELayer(6, 3, 4, 2, dtype=f64), torch.nn.Linear(6, 11, dtype=f64))


def test_lm_router_gradients_gate_rules_and_restores_the_layers():
    model = _tiny_moe_lm()
    ids = torch.randint(0, 11, (3, 9), generator=gen(8))
    top1 = lm_router_gradients(model, ids, 1, True)
    assert len(top1) == 2 and all(g.shape == (4, 6) for g in top1)
    assert max(float(g.abs().max()) for g in top1) < 1e-15
    for rule in ((2, True), (1, False)):
        assert min(float(g.abs().max()) for g in lm_router_gradients(model, ids, *rule)) > 1e-7
    with_aux = lm_router_gradients(model, ids, 1, True, balance_alpha=0.01, z_loss=1e-3)
    assert min(float(g.abs().max()) for g in with_aux) > 1e-6
    # the auxiliary part alone, computed by hand from the layers' logits, equals the difference
    layers = [model[1], model[2]]
    for m in layers:
        m.top_k = 1
    model(ids[:, :-1])
    aux = sum(load_balancing_loss(m.router_logits, 1, 0.01) + 1e-3 * router_z_loss(m.router_logits) for m in layers)
    by_hand = torch.autograd.grad(aux, [m.router.weight for m in layers])
    for m in layers:
        m.top_k = 2
    for a, b in zip(with_aux, by_hand, strict=True):
        assert torch.allclose(a, b, atol=1e-14)
    assert [(m.top_k, m.normalize) for m in layers] == [(2, True), (2, True)]  # restored


def test_lm_router_gradients_bad_inputs():
    model = _tiny_moe_lm()
    ids = torch.randint(0, 11, (2, 5), generator=gen(9))
    with pytest.raises(TypeError, match="model"):
        lm_router_gradients("m", ids, 1, True)
    with pytest.raises(ValueError, match="no MoELayer"):
        lm_router_gradients(torch.nn.Linear(2, 2), ids, 1, True)
    with pytest.raises(ValueError, match="ids"):
        lm_router_gradients(model, ids[:, :1], 1, True)
    with pytest.raises(TypeError, match="normalize"):
        lm_router_gradients(model, ids, 1, 1)
    with pytest.raises(ValueError, match="balance_alpha"):
        lm_router_gradients(model, ids, 1, True, balance_alpha=-1.0)
    with pytest.raises(ValueError, match="top_k=5 exceeds the number of experts"):
        lm_router_gradients(model, ids, 5, True)
    assert [(m.top_k, m.normalize) for m in (model[1], model[2])] == [(2, True), (2, True)]
