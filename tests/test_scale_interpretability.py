"""Tests for llmbook.scale.interpretability: ICL score, ablation effects, the hand-built circuit,
and the hooks that read a real TransformerLM (chapter 24b), against a transformers Llama peer."""

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
    attention_patterns,
    attention_sink_score,
    auc,
    basis_probe,
    ffn_activations,
    ffn_keys_values,
    head_ablation_effects,
    icl_score,
    induction_circuit,
    induction_circuit_weights,
    logit_lens,
    patch_residual,
    random_rotation,
    read_through_unembedding,
    repeat_mask,
    residual_stream,
    top_activating,
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


# ---------------------------------------------------------------- reading a TransformerLM (24b)


@pytest.fixture(scope="module")
def llama_pair():
    """A tiny random transformers Llama (eager attention, grouped keys, non-square shapes) and
    the book's copy of it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmbook.transformer.hf_loading import from_hf

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=37, hidden_size=24, intermediate_size=40, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=True, attn_implementation="eager")
    hf = LlamaForCausalLM(cfg).double().eval()
    return hf, from_hf(hf).double().eval()


def _ids(T=7, B=2, V=37, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def test_residual_stream_and_attention_match_transformers(llama_pair):
    hf, model = llama_pair
    ids = _ids()
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True, output_attentions=True)
    resid = residual_stream(model, ids)
    assert resid.shape == (4, 2, 7, 24)
    for layer in range(3):  # transformers' last hidden state is after the final norm
        torch.testing.assert_close(resid[layer], out.hidden_states[layer], atol=1e-7, rtol=0)
    pattern = attention_patterns(model, ids)
    assert pattern.shape == (3, 2, 4, 7, 7)
    # (transformers builds RoPE's cos and sin in float32, hence 1e-7 and not round-off)
    torch.testing.assert_close(pattern, torch.stack(out.attentions), atol=1e-7, rtol=0)
    lens = logit_lens(model, resid)
    torch.testing.assert_close(lens[-1], out.logits, atol=1e-7, rtol=0)
    assert not torch.allclose(lens[0], out.logits)  # the early layers do read differently


def test_attention_patterns_do_not_depend_on_the_kernel(llama_pair):
    _, model = llama_pair
    ids = _ids(T=5, B=3)
    fused = attention_patterns(model, ids)
    model.set_fused_attention(False)
    try:
        torch.testing.assert_close(attention_patterns(model, ids), fused)
    finally:
        model.set_fused_attention(True)
    torch.testing.assert_close(fused.sum(-1), torch.ones(3, 3, 4, 5, dtype=D))
    assert bool((fused.triu(1) == 0).all())  # causal


def test_hooks_are_removed(llama_pair):
    _, model = llama_pair
    residual_stream(model, _ids())
    attention_patterns(model, _ids())
    ffn_activations(model, _ids(), 1)
    for module in model.modules():
        assert not module._forward_pre_hooks and not module._forward_hooks


def test_attention_sink_score_worked_example_and_bad_input():
    T = 4
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    pattern = torch.stack([uniform, torch.eye(T)])[None].double()  # (1, 2, T, T)
    pattern[0, 1, 1:, :] = 0
    pattern[0, 1, 1:, 0] = 1  # a perfect sink
    torch.testing.assert_close(attention_sink_score(pattern), torch.tensor([13 / 36, 1.0], dtype=D))
    with pytest.raises(ValueError, match="pattern"):
        attention_sink_score(torch.ones(2, 4, 4))
    with pytest.raises(ValueError, match="pattern"):
        attention_sink_score(torch.ones(1, 1, 3, 4))
    with pytest.raises(TypeError, match="pattern"):
        attention_sink_score(torch.ones(1, 1, 3, 3, dtype=torch.long))


def test_logit_lens_bad_input(llama_pair):
    _, model = llama_pair
    with pytest.raises(ValueError, match="d_model=24"):
        logit_lens(model, torch.ones(3, 5, dtype=D))
    with pytest.raises(TypeError, match="model"):
        logit_lens(torch.nn.Linear(2, 2), torch.ones(3, 24))
    with pytest.raises(ValueError, match="ids"):
        residual_stream(model, torch.tensor([[1, 40]]))


def test_patch_residual_exact_cases(llama_pair):
    _, model = llama_pair
    clean = _ids(T=6, B=1, seed=3)
    corrupt = clean.clone()
    corrupt[0, 2] = (clean[0, 2] + 5) % 37  # one token differs, at position 2

    def metric(z):
        return z[:, 4] - z[:, 11]

    effects, c, k = patch_residual(model, clean, corrupt, metric)
    assert effects.shape == (4, 6)
    with torch.no_grad():
        z_clean, z_corrupt = model(clean)[0, -1:], model(corrupt)[0, -1:]
    torch.testing.assert_close(c, metric(z_clean)[0])
    torch.testing.assert_close(k, metric(z_corrupt)[0])
    # the embedding of the one differing token carries everything; the others change nothing
    torch.testing.assert_close(effects[0, 2], c, atol=1e-10, rtol=0)
    torch.testing.assert_close(effects[0, [0, 1, 3, 4, 5]], k.expand(5), atol=1e-10, rtol=0)
    # before position 2 the two runs agree at every layer: patching there changes nothing
    torch.testing.assert_close(effects[:, :2], k.expand(4, 2), atol=1e-10, rtol=0)
    # the final site at the last position is the clean output itself
    torch.testing.assert_close(effects[-1, -1], c, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="shape"):
        patch_residual(model, clean, corrupt[:, :5], metric)
    with pytest.raises(ValueError, match="shape"):
        patch_residual(model, clean.expand(2, -1), corrupt.expand(2, -1), metric)
    with pytest.raises(TypeError, match="metric"):
        patch_residual(model, clean, corrupt, 3)


def test_ffn_keys_values_rebuild_the_feed_forward_layer(llama_pair):
    _, model = llama_pair
    ids, layer = _ids(T=5, B=2), 1
    seen = []
    hook = model.blocks[layer].mlp.register_forward_hook(lambda _m, a, o: seen.append((a[0], o)))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        hook.remove()
    x, out = seen[0]  # the normed input (B, T, d) and output (B, T, d) of the FFN
    kv = ffn_keys_values(model, layer)
    assert kv["keys"].shape == kv["values"].shape == kv["gates"].shape == (40, 24)
    h = ffn_activations(model, ids, layer)
    assert h.shape == (2, 5, 40)
    torch.testing.assert_close(h, torch.nn.functional.silu(x @ kv["gates"].T) * (x @ kv["keys"].T))
    torch.testing.assert_close(h @ kv["values"], out)  # output = sum_i h_i value_i
    with pytest.raises(ValueError, match="layer"):
        ffn_activations(model, ids, 3)


def test_ffn_keys_values_of_the_gelu_mlp():
    from llmbook.transformer.model import TransformerConfig, TransformerLM

    model = TransformerLM(TransformerConfig.gpt2_style(vocab_size=11, d_model=8, n_layers=2,
                                                       n_heads=2, max_seq_len=8),
                          generator=torch.Generator().manual_seed(0))
    kv = ffn_keys_values(model, 0)
    assert set(kv) == {"keys", "values"} and kv["keys"].shape == kv["values"].shape == (32, 8)
    assert ffn_activations(model, torch.tensor([[1, 2, 3]]), 0).shape == (1, 3, 32)


def test_read_through_unembedding_is_the_lens_without_the_rms(llama_pair):
    _, model = llama_pair
    v = torch.randn(3, 24, generator=torch.Generator().manual_seed(4), dtype=D)
    rms = (v.pow(2).mean(-1, keepdim=True) + model.final_norm.eps).sqrt()
    torch.testing.assert_close(read_through_unembedding(model, v), logit_lens(model, v) * rms)
    e = torch.zeros(24, dtype=D)
    e[5] = 1.0
    torch.testing.assert_close(read_through_unembedding(model, e),
                               model.final_norm.weight[5] * model.embed.weight[:, 5])
    torch.testing.assert_close(read_through_unembedding(model, v, torch.tensor([30, 2])),
                               read_through_unembedding(model, v)[:, [30, 2]])
    with pytest.raises(ValueError, match="vectors"):
        read_through_unembedding(model, torch.ones(23, dtype=D))
    with pytest.raises(ValueError, match="tokens"):
        read_through_unembedding(model, v, torch.tensor([37]))


def test_top_activating_worked_example_and_bad_input():
    a = torch.zeros(2, 3, 4)
    a[1, 2, 1], a[0, 1, 1], a[0, 0, 1] = 5.0, 3.0, 1.0
    values, where = top_activating(a, 1, 2)
    assert values.tolist() == [5.0, 3.0] and where.tolist() == [[1, 2], [0, 1]]
    with pytest.raises(ValueError, match="k=7"):
        top_activating(a, 1, 7)
    with pytest.raises(ValueError, match="unit"):
        top_activating(a, 4, 1)
    with pytest.raises(ValueError, match="activations"):
        top_activating(a[0], 1, 1)


def test_auc_worked_example_and_bad_input():
    s = torch.tensor([0.1, 0.4, 0.35, 0.8])
    y = torch.tensor([False, False, True, True])
    assert float(auc(s, y)) == 0.75  # the scikit-learn documentation's example
    assert float(auc(torch.tensor([1.0, 1.0]), torch.tensor([True, False]))) == 0.5  # a tie
    with pytest.raises(ValueError, match="both classes"):
        auc(s, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="labels"):
        auc(s, y[:3])


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 30), st.integers(0, 10_000))
def test_auc_properties(n, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(n, generator=g, dtype=D)
    y = torch.arange(n) % 2 == 0
    a = auc(s, y)
    torch.testing.assert_close(auc(-s, y), 1 - a)  # reversing the scores
    torch.testing.assert_close(auc(torch.exp(3 * s), y), a)  # only the order counts
    pos, neg = s[y], s[~y]
    brute = sum(float(p > q) for p in pos for q in neg) / (len(pos) * len(neg))
    assert abs(float(a) - brute) < 1e-12


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 12), st.integers(0, 10_000))
def test_random_rotation_is_orthogonal(d, seed):
    Q = random_rotation(d, torch.Generator().manual_seed(seed))
    torch.testing.assert_close(Q @ Q.T, torch.eye(d, dtype=D))
    assert abs(abs(float(torch.linalg.det(Q))) - 1) < 1e-10


def test_basis_probe_finds_a_coordinate_and_a_direction():
    g = torch.Generator().manual_seed(0)
    N, d = 400, 20
    y = torch.arange(N) % 2 == 0
    train = torch.arange(N) < 300
    X = torch.randn(N, d, generator=g, dtype=D)
    X[:, 7] += 3.0 * y  # the property lives in coordinate 7
    r = basis_probe(X, y, train)
    assert r["best_dim"] == 7 and r["best_dim_auc"] > 0.95 and r["direction_auc"] > 0.95
    assert r["top10_share"] > 0.8  # 2 of 20 coordinates hold the direction
    Q = random_rotation(d, g)
    s = basis_probe(X @ Q, y, train)  # the same property along a rotated direction
    assert abs(s["direction_auc"] - r["direction_auc"]) < 0.03  # directions do not care
    assert s["best_dim_auc"] < r["best_dim_auc"] - 0.1  # single coordinates do
    assert s["top10_share"] < r["top10_share"]
    with pytest.raises(ValueError, match="train split"):
        basis_probe(X, y, torch.zeros(N, dtype=torch.bool))
    with pytest.raises(ValueError, match="labels"):
        basis_probe(X, y[:5], train)
    with pytest.raises(ValueError, match="X"):
        basis_probe(X[0], y, train)


def test_real_model_attention_matches_transformers_peer():
    """SmolLM2-135M-Instruct: the book's reading of a few heads against transformers'
    output_attentions, to 1e-4 (float32)."""
    from llmbook.inference.gguf import load_model, smollm2_path, transformers_peer

    try:
        smollm2_path()
    except FileNotFoundError:
        pytest.skip("SmolLM2-135M-Instruct is not installed")
    model, tok = load_model()
    peer, _ = transformers_peer()
    peer.config._attn_implementation = "eager"
    ids = torch.tensor([tok.encode("The capital of France is Paris, and of Italy Rome.")])
    with torch.no_grad():
        out = peer(ids, output_attentions=True, output_hidden_states=True)
    pattern = attention_patterns(model, ids)
    for layer in (0, 3, 17, 29):
        torch.testing.assert_close(pattern[layer], out.attentions[layer], atol=1e-4, rtol=0)
    resid = residual_stream(model, ids)
    torch.testing.assert_close(logit_lens(model, resid)[-1], out.logits, atol=1e-3, rtol=0)
