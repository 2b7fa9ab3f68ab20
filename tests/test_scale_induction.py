"""Tests for llmbook.scale.induction: data, the attention-only model and its hooks, head scores."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.scale.induction import (
    INDUCTION_RECIPES,
    AttentionOnlyTransformer,
    induction_batch,
    load_induction_model,
    per_position_loss,
    prefix_matching_score,
    previous_token_score,
    repeated_tokens,
    train_induction_model,
)
from llmbook.transformer.attention import MultiHeadAttention, causal_mask

pytestmark = pytest.mark.usefixtures("one_thread")
D = torch.float64


def small_model(positions="rope", layers=2, seed=0) -> AttentionOnlyTransformer:
    return AttentionOnlyTransformer(29, 24, layers, 3, 20, positions=positions, generator=gen(seed)).double()


# ---------------------------------------------------------------- data


@given(B=st.integers(1, 4), L=st.integers(1, 9), V=st.integers(2, 40), seed=st.integers(0, 99))
@settings(max_examples=30, deadline=None)
def test_repeated_tokens_repeat(B, L, V, seed):
    ids = repeated_tokens(B, L, V, gen(seed))
    assert ids.shape == (B, 2 * L) and ids.dtype == torch.int64
    assert torch.equal(ids[:, :L], ids[:, L:])
    assert int(ids.min()) >= 0 and int(ids.max()) < V


def test_repeated_tokens_distinct_and_seeded():
    ids = repeated_tokens(50, 12, 16, gen(1), distinct=True)
    assert all(len(set(row[:12].tolist())) == 12 for row in ids)
    assert torch.equal(ids, repeated_tokens(50, 12, 16, gen(1), distinct=True))
    with pytest.raises(ValueError, match="distinct"):
        repeated_tokens(2, 17, 16, gen(0), distinct=True)
    with pytest.raises(TypeError, match="generator"):
        repeated_tokens(2, 3, 16, 0)
    with pytest.raises(ValueError, match="segment_length"):
        repeated_tokens(2, 0, 16, gen(0))


@given(seed=st.integers(0, 200), lo=st.integers(2, 6), extra=st.integers(0, 5))
@settings(max_examples=30, deadline=None)
def test_induction_batch_marks_exactly_the_predictable_copies(seed, lo, extra):
    T, hi = 30, lo + extra
    ids, repeat = induction_batch(8, T, 50, lo, hi, gen(seed))
    assert ids.shape == repeat.shape == (8, T) and repeat.dtype == torch.bool
    for row, mask in zip(ids, repeat, strict=True):
        where = mask.nonzero()[:, 0]
        n = len(where)  # L - 1 predictable tokens, contiguous, ending the copy
        assert lo - 1 <= n <= hi - 1
        assert torch.equal(where, torch.arange(int(where[0]), int(where[0]) + n))
        L = n + 1
        for t in where.tolist():
            assert row[t] == row[t - L] and row[t - 1] == row[t - 1 - L]


def test_induction_batch_bad_input():
    with pytest.raises(ValueError, match="max_segment"):
        induction_batch(2, 20, 10, 4, 11, gen(0))
    with pytest.raises(ValueError, match="min_segment"):
        induction_batch(2, 20, 10, 6, 5, gen(0))


# ---------------------------------------------------------------- the model


def test_model_equals_multi_head_attention_and_torch_sdpa():
    model = small_model(positions="learned", layers=1)
    ids = torch.randint(0, 29, (3, 13), generator=gen(2))
    x0 = model.embed(ids) + model.pos(torch.arange(13))
    for fused in (False, True):
        mha = MultiHeadAttention(24, 3, fused=fused).double()
        mha.load_state_dict(model.layers[0].state_dict())
        with torch.no_grad():
            assert torch.allclose(model.unembed(x0 + mha(x0)), model(ids), atol=1e-12)


def test_rope_model_matches_multi_head_attention_with_rope():
    model = small_model(positions="rope", layers=1)
    ids = torch.randint(0, 29, (2, 9), generator=gen(3))
    x0 = model.embed(ids)
    with torch.no_grad():
        out = model.layers[0](x0, rope=model.rope)
        assert torch.allclose(model.unembed(x0 + out), model(ids), atol=1e-12)


def test_cache_patterns_are_causal_distributions():
    model = small_model()
    ids = torch.randint(0, 29, (2, 11), generator=gen(4))
    logits, cache = model.run_with_cache(ids)
    assert logits.shape == (2, 11, 29) and len(cache["pattern"]) == 2
    for p, z in zip(cache["pattern"], cache["z"], strict=True):
        assert p.shape == (2, 3, 11, 11) and z.shape == (2, 3, 11, 8)
        assert torch.allclose(p.sum(-1), torch.ones(2, 3, 11, dtype=D))
        assert (p[..., ~causal_mask(11)] == 0).all()


def test_causal_model_ignores_the_future():
    model = small_model()
    ids = torch.randint(0, 29, (1, 12), generator=gen(5))
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 29
    with torch.no_grad():
        assert torch.allclose(model(ids)[:, :8], model(changed)[:, :8], atol=1e-13)


def test_zero_and_mean_ablation():
    model = small_model()
    ids = torch.randint(0, 29, (4, 10), generator=gen(6))
    with torch.no_grad():
        base, cache = model.run_with_cache(ids)
        # ablating with the head's own output changes nothing; with zero, it does
        same = model(ids, ablate={(0, 1): cache["z"][0][0, 1]})[0]
        assert torch.allclose(same, base[0], atol=1e-12)
        _, abl = model.run_with_cache(ids, ablate={(1, 2): None})
        assert (abl["z"][1][:, 2] == 0).all()
        assert not torch.allclose(model(ids, ablate={(0, 0): None}), base)
        # ablating a layer-1 head leaves layer 0 alone
        assert torch.equal(abl["pattern"][0], cache["pattern"][0])


def test_composition_cut_and_one_layer_keys():
    model = small_model()
    ids = torch.randint(0, 29, (2, 10), generator=gen(7))
    with torch.no_grad():
        base = model(ids)
        # layer 0 reads x_0 anyway: cutting it changes nothing
        assert torch.allclose(model(ids, composition={0: "qkv"}), base, atol=1e-13)
        for which in "qkv":
            assert not torch.allclose(model(ids, composition={1: which}), base, atol=1e-6)
        # cutting q, k and v of layer 1 = layer 1 reads the embeddings: the layers act in parallel
        x0 = model.embed(ids)
        par = x0 + sum(a(x0, rope=model.rope) for a in model.layers)
        assert torch.allclose(model(ids, composition={1: "qkv"}), model.unembed(par), atol=1e-12)


def test_model_bad_input():
    model = small_model()
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 21, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 29\)"):
        model(torch.full((1, 3), 29))
    with pytest.raises(TypeError, match="integer"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="layer"):
        model(torch.zeros(1, 3, dtype=torch.long), ablate={(2, 0): None})
    with pytest.raises(ValueError, match=r"\(T, d_head\)"):
        model(torch.zeros(1, 3, dtype=torch.long), ablate={(0, 0): torch.zeros(4, 8, dtype=D)})
    with pytest.raises(ValueError, match="'q'"):
        model(torch.zeros(1, 3, dtype=torch.long), composition={1: "x"})
    with pytest.raises(ValueError, match="positions"):
        AttentionOnlyTransformer(5, 8, 1, 2, 4, positions="alibi")


# ---------------------------------------------------------------- losses and scores


def test_per_position_loss_worked_example():
    logits = torch.zeros(1, 3, 4, dtype=D)
    logits[0, 0, 2] = math.log(3.0)  # p(2) = 3/6 at position 0
    ids = torch.tensor([[1, 2, 0]])
    loss = per_position_loss(logits, ids)
    assert loss.shape == (1, 2)
    assert loss[0, 0] == pytest.approx(math.log(2.0), abs=1e-15)
    assert loss[0, 1] == pytest.approx(math.log(4.0), abs=1e-15)
    with pytest.raises(ValueError, match=r"\(B, T, V\)"):
        per_position_loss(torch.zeros(1, 4, 4), ids)
    with pytest.raises(ValueError, match="2 positions"):
        per_position_loss(torch.zeros(1, 1, 4), ids[:, :1])


def test_head_scores_worked_examples():
    T, L = 8, 4
    shift = torch.zeros(T, T, dtype=D)
    shift[0, 0] = 1.0
    shift[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    induction = torch.eye(T, dtype=D)
    induction[torch.arange(L, T)] = 0.0
    induction[torch.arange(L, T), torch.arange(1, L + 1)] = 1.0
    p = torch.stack([shift, induction])[None].expand(3, 2, T, T)  # (B, H, T, T)
    assert previous_token_score(p).tolist() == [1.0, pytest.approx(0.0)]
    assert prefix_matching_score(p, L).tolist() == [0.0, 1.0]
    uniform = causal_mask(T).double()
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None, None]
    expected = sum(1 / (L + i + 1) for i in range(L)) / L
    assert float(prefix_matching_score(uniform, L)[0]) == pytest.approx(expected, abs=1e-15)
    with pytest.raises(ValueError, match="2L"):
        prefix_matching_score(p, 3)
    with pytest.raises(ValueError, match=r"\(B, H, T, T\)"):
        previous_token_score(shift)


# ---------------------------------------------------------------- training and the shipped runs


def test_training_runs_and_reports_curves():
    recipe = {**INDUCTION_RECIPES["induction_2l"], "steps": 6, "eval_every": 3, "snapshots": [3],
              "eval_batch": 4, "batch_size": 4, "warmup_steps": 2}
    tensors, info = train_induction_model(recipe)
    hist = info["history"]
    assert hist["step"] == [0, 3, 6]
    assert len(hist["position_loss"][0]) == 2 * recipe["eval_segment"] - 1
    assert len(hist["prefix_matching"][1]) == 2 and len(hist["prefix_matching"][1][0]) == 2
    assert "step3.embed.weight" in tensors and "embed.weight" in tensors
    assert not torch.equal(tensors["step3.embed.weight"], tensors["embed.weight"])
    assert torch.get_num_threads() >= 1


@pytest.mark.parametrize("name", sorted(INDUCTION_RECIPES))
def test_shipped_models_load_and_match_their_curves(name):
    model, info = load_induction_model(name)
    r = info["recipe"]
    ids = repeated_tokens(r["eval_batch"], r["eval_segment"], r["vocab_size"], gen(r["seed"] + 1000))
    with torch.no_grad():
        loss = per_position_loss(model(ids), ids).mean(0)
    assert torch.allclose(loss, torch.tensor(info["history"]["position_loss"][-1]), atol=1e-3)
    L = r["eval_segment"]
    if name == "induction_2l":
        assert float(loss[L:].mean()) < 0.6
        snap, _ = load_induction_model(name, step=r["snapshots"][0])
        assert not torch.equal(snap.embed.weight, model.embed.weight)
    else:
        assert float(loss[L:].mean()) > 3.0
    with pytest.raises(ValueError, match="snapshot"):
        load_induction_model(name, step=7)


def test_load_unknown_model():
    with pytest.raises(ValueError, match="unknown induction model"):
        load_induction_model("induction_3l")


# ---------------------------------------------------------------- thresholds and other models


def test_alignment_chance_exact_and_by_enumeration():
    from itertools import product

    from llmbook.scale.induction import alignment_chance

    for n, k, w in ((5, 2, 1), (6, 3, 2), (4, 3, 0)):
        count = sum(max(t) - min(t) <= w for t in product(range(n), repeat=k))
        assert alignment_chance(n, k, w) == pytest.approx(count / n ** k, abs=1e-15)
    assert alignment_chance(5, 2, 1) == pytest.approx(13 / 25)
    assert alignment_chance(80, 4, 79) == 1.0
    assert alignment_chance(80, 4, 4) == pytest.approx(0.00069091796875)
    with pytest.raises(ValueError, match="window"):
        alignment_chance(10, 2, -1)


def test_lm_attention_patterns_reproduce_the_attention_output():
    from llmbook.scale.induction import lm_attention_patterns
    from llmbook.transformer.model import TransformerConfig, TransformerLM

    torch.manual_seed(0)
    for cfg in (TransformerConfig.gpt2_style(vocab_size=31, d_model=24, n_layers=2, n_heads=3, max_seq_len=16),
                TransformerConfig.llama_style(vocab_size=31, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2,
                                              max_seq_len=16)):
        model = TransformerLM(cfg).double().eval()
        ids = torch.randint(0, 31, (2, 9))
        outputs: list = []
        hooks = [b.attn.register_forward_hook(lambda m, a, o, store=outputs: store.append(o))
                 for b in model.blocks]
        logits, patterns = lm_attention_patterns(model, ids)
        for h in hooks:
            h.remove()
        with torch.no_grad():
            assert torch.equal(logits, model(ids))
        assert len(patterns) == 2 and patterns[0].shape == (2, cfg.n_heads, 9, 9)
        for pattern in patterns:
            assert torch.allclose(pattern.sum(-1), torch.ones(2, cfg.n_heads, 9, dtype=D))
            assert torch.all(pattern.triu(1) == 0)
        # rebuild layer 0's output from its pattern: o_proj(A v) with v from the normed input
        with torch.no_grad():
            x = model.embed.weight[ids] + (model.pos_embed.weight[:9] if model.pos_embed is not None else 0)
            attn = model.blocks[0].attn
            _, _, v = attn.project_qkv(model.blocks[0].attn_norm(x))
            v = v.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=-3)
            z = (patterns[0] @ v).transpose(1, 2).reshape(2, 9, -1)
            assert torch.allclose(attn.o_proj(z), outputs[0], atol=1e-12)
    with pytest.raises(TypeError, match="TransformerLM"):
        lm_attention_patterns(small_model(), torch.zeros(1, 3, dtype=torch.long))
