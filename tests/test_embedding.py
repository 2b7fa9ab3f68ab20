"""Tests for llmbook.text.embedding: one-hot, lookup, gradients, tying, cosines, parameter counts."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.text.embedding import (
    TokenEmbedding,
    cosine_similarity,
    embedding_grad,
    embedding_parameter_count,
    nearest_rows,
    one_hot,
    pairwise_cosine,
)

# ---------------------------------------------------------------- one_hot


def test_one_hot_worked_example():
    X = one_hot(torch.tensor([2, 0, 2]), 4)
    expected = torch.tensor([[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]], dtype=torch.float32)
    assert X.dtype == torch.float32
    assert torch.equal(X, expected)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_one_hot_equals_torch(shape):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 11, shape, generator=g)
    ours = one_hot(ids, 11, dtype=torch.int64)
    assert ours.shape == (*shape, 11)
    assert torch.equal(ours, F.one_hot(ids, 11))


def test_one_hot_rows_sum_to_one_and_int32_ids():
    ids = torch.tensor([[0, 4], [3, 3], [1, 2]], dtype=torch.int32)  # B=3 != T=2
    X = one_hot(ids, 5, dtype=torch.float64)
    assert torch.equal(X.sum(-1), torch.ones(3, 2, dtype=torch.float64))
    assert torch.equal(X.argmax(-1), ids.long())


def test_one_hot_bad_inputs():
    with pytest.raises(ValueError, match=r"token id 5 .* V=5"):
        one_hot(torch.tensor([0, 5]), 5)
    with pytest.raises(ValueError, match=r"token id -1 .* V=5"):
        one_hot(torch.tensor([-1, 2]), 5)
    with pytest.raises(TypeError, match="integer dtype"):
        one_hot(torch.tensor([0.0, 1.0]), 5)
    with pytest.raises(TypeError, match="integer dtype"):
        one_hot(torch.tensor([True, False]), 5)
    with pytest.raises(TypeError, match="torch.Tensor"):
        one_hot([0, 1], 5)
    with pytest.raises(ValueError, match="vocab_size must be positive"):
        one_hot(torch.tensor([0]), 0)
    with pytest.raises(TypeError, match="vocab_size must be an int"):
        one_hot(torch.tensor([0]), 5.0)


# ---------------------------------------------------------------- TokenEmbedding forward


def test_forward_equals_nn_embedding_and_functional_exactly():
    g = torch.Generator().manual_seed(1)
    emb = TokenEmbedding(13, 6, generator=g)  # V=13 != d=6
    ids = torch.randint(0, 13, (3, 5), generator=g)  # B=3 != T=5
    out = emb(ids)
    assert out.shape == (3, 5, 6)
    ref = torch.nn.Embedding(13, 6)
    ref.load_state_dict(emb.state_dict())
    assert torch.equal(out, ref(ids))
    assert torch.equal(out, F.embedding(ids, emb.weight))


def test_forward_equals_one_hot_matmul():
    g = torch.Generator().manual_seed(2)
    emb = TokenEmbedding(9, 4, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 9, (2, 7), generator=g)
    X = one_hot(ids, 9, dtype=torch.float64)  # (B, T, V)
    # A one-hot product adds exact zeros to one entry: equal to the last bit.
    assert torch.equal(emb(ids), X @ emb.weight)
    # ... and to nn.Linear(V, d, bias=False) with weight E^T applied to one-hot inputs.
    lin = torch.nn.Linear(9, 4, bias=False, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(emb.weight.T)
    assert torch.equal(emb(ids), lin(X))


def test_init_statistics_and_determinism():
    emb = TokenEmbedding(2000, 64, generator=torch.Generator().manual_seed(0))
    w = emb.weight.detach()
    assert abs(w.mean().item()) < 1e-3
    assert abs(w.std().item() - 0.02) < 5e-4
    again = TokenEmbedding(2000, 64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(w, again.weight.detach())
    wide = TokenEmbedding(500, 32, std=1.0, generator=torch.Generator().manual_seed(0))
    assert abs(wide.weight.detach().std().item() - 1.0) < 0.03


def test_token_embedding_bad_inputs():
    emb = TokenEmbedding(10, 4)
    with pytest.raises(ValueError, match=r"token id 10 .* V=10"):
        emb(torch.tensor([[1, 10]]))
    with pytest.raises(TypeError, match="integer dtype"):
        emb(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"d=4"):
        emb.logits(torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="d_model must be positive"):
        TokenEmbedding(10, 0)
    with pytest.raises(ValueError, match="vocab_size must be positive"):
        TokenEmbedding(-3, 4)
    with pytest.raises(ValueError, match="std must be positive"):
        TokenEmbedding(10, 4, std=0.0)


# ---------------------------------------------------------------- gradients


def test_embedding_grad_worked_example():
    ids = torch.tensor([2, 0, 2])
    G = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    expected = torch.tensor([[3.0, 4.0], [0.0, 0.0], [6.0, 8.0], [0.0, 0.0]])
    assert torch.equal(embedding_grad(ids, G, 4), expected)


def test_embedding_grad_equals_autograd_and_one_hot_formula():
    g = torch.Generator().manual_seed(3)
    V, d, B, T = 11, 5, 2, 6
    emb = TokenEmbedding(V, d, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (B, T), generator=g)
    G = torch.randn(B, T, d, generator=g, dtype=torch.float64)
    (emb(ids) * G).sum().backward()
    ours = embedding_grad(ids, G, V)
    assert torch.allclose(emb.weight.grad, ours, rtol=0, atol=1e-15)
    X = one_hot(ids, V, dtype=torch.float64).reshape(B * T, V)
    assert torch.allclose(ours, X.T @ G.reshape(B * T, d), rtol=0, atol=1e-15)
    unseen = sorted(set(range(V)) - set(ids.flatten().tolist()))
    assert unseen, "the example should leave some tokens unseen"
    assert torch.equal(ours[unseen], torch.zeros(len(unseen), d, dtype=torch.float64))


def test_gradcheck_forward_and_logits():
    g = torch.Generator().manual_seed(4)
    emb = TokenEmbedding(7, 3, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 7, (2, 4), generator=g)
    h = torch.randn(2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)

    def lookup(W):  # the module's forward as a function of its weight
        return torch.func.functional_call(emb, {"weight": W}, (ids,))

    W = emb.weight.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lookup, (W,))
    assert torch.autograd.gradcheck(lambda hh, WW: hh @ WW.T, (h, W))
    assert torch.autograd.gradcheck(emb.logits, (h,))


def test_tied_gradient_is_sum_of_both_uses():
    g = torch.Generator().manual_seed(5)
    V, d, B, T = 10, 4, 3, 2
    emb = TokenEmbedding(V, d, generator=g, dtype=torch.float64)
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)

    def loss(E_in, E_out):
        h = torch.tanh(E_in[ids] @ A)  # (B, T, d)
        z = h @ E_out.T  # (B, T, V)
        return F.cross_entropy(z.reshape(-1, V), targets.reshape(-1))

    E = emb.weight
    loss(E, E).backward()
    tied = E.grad.clone()
    E1 = E.detach().clone().requires_grad_(True)
    E2 = E.detach().clone().requires_grad_(True)
    loss(E1, E2).backward()
    assert torch.allclose(tied, E1.grad + E2.grad, rtol=0, atol=1e-15)
    # Both uses contribute: neither part alone is the tied gradient.
    assert (tied - E1.grad).abs().max() > 1e-3
    assert (tied - E2.grad).abs().max() > 1e-3
    # And the module's own logits method shares the weight the same way.
    emb.zero_grad()
    h = torch.tanh(emb(ids) @ A)
    F.cross_entropy(emb.logits(h).reshape(-1, V), targets.reshape(-1)).backward()
    assert torch.allclose(emb.weight.grad, tied, rtol=0, atol=1e-15)


def test_embedding_grad_bad_inputs():
    with pytest.raises(ValueError, match=r"grad_output must have shape"):
        embedding_grad(torch.tensor([0, 1]), torch.zeros(3, 2), 4)
    with pytest.raises(ValueError, match=r"grad_output must have shape"):
        embedding_grad(torch.tensor([0, 1]), torch.zeros(2), 4)
    with pytest.raises(ValueError, match=r"token id 4 .* V=4"):
        embedding_grad(torch.tensor([0, 4]), torch.zeros(2, 3), 4)


# ---------------------------------------------------------------- cosine


def test_cosine_worked_examples():
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0], [3.0, 4.0]])
    b = torch.tensor([[0.0, 2.0], [-2.0, -2.0], [4.0, 3.0]])
    assert torch.allclose(cosine_similarity(a, b), torch.tensor([0.0, -1.0, 0.96]), atol=1e-7)
    assert cosine_similarity(torch.zeros(3), torch.ones(3)).item() == 0.0


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cosine_equals_torch(dim):
    g = torch.Generator().manual_seed(6)
    a = torch.randn(4, 7, 3, generator=g)
    b = torch.randn(4, 7, 3, generator=g)
    ours = cosine_similarity(a, b, dim=dim)
    assert torch.allclose(ours, F.cosine_similarity(a, b, dim=dim), rtol=0, atol=1e-6)


def test_cosine_gradcheck():
    g = torch.Generator().manual_seed(7)
    a = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(cosine_similarity, (a, b))


def test_pairwise_cosine_equals_torch_and_is_symmetric():
    g = torch.Generator().manual_seed(8)
    E = torch.randn(6, 9, generator=g, dtype=torch.float64)  # V=6 != d=9
    C = pairwise_cosine(E)
    ref = F.cosine_similarity(E[:, None, :], E[None, :, :], dim=-1)
    assert C.shape == (6, 6)
    assert torch.allclose(C, ref, rtol=0, atol=1e-12)
    assert torch.equal(C, C.T)
    assert torch.allclose(C.diagonal(), torch.ones(6, dtype=torch.float64), atol=1e-15)


def test_cosine_bad_inputs():
    with pytest.raises(ValueError, match=r"equal shapes, got \(3,\) and \(4,\)"):
        cosine_similarity(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match=r"equal shapes, got \(2, 3\) and \(3,\)"):
        cosine_similarity(torch.ones(2, 3), torch.ones(3))
    with pytest.raises(ValueError, match="eps must be positive"):
        cosine_similarity(torch.ones(3), torch.ones(3), eps=0.0)
    with pytest.raises(ValueError, match=r"\(V, d\) matrix, got \(2, 3, 4\)"):
        pairwise_cosine(torch.ones(2, 3, 4))
    with pytest.raises(TypeError, match="expects tensors"):
        cosine_similarity([1.0], torch.ones(1))


vectors = st.integers(min_value=1, max_value=12).flatmap(
    lambda n: st.tuples(
        *[
            st.lists(
                st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False), min_size=n, max_size=n
            )
            for _ in range(2)
        ]
    )
)


@settings(max_examples=60, deadline=None)
@given(vectors, st.floats(1e-3, 1e3))
def test_cosine_properties(ab, scale):
    a = torch.tensor(ab[0], dtype=torch.float64)
    b = torch.tensor(ab[1], dtype=torch.float64)
    c = cosine_similarity(a, b)
    assert -1.0 <= c.item() <= 1.0
    assert cosine_similarity(b, a).item() == c.item()
    if a.norm() > 1e-3 and b.norm() > 1e-3:  # away from the eps floor, scaling cancels
        assert abs(cosine_similarity(scale * a, b).item() - c.item()) < 1e-12
        assert abs(cosine_similarity(-a, b).item() + c.item()) < 1e-12


# ---------------------------------------------------------------- parameter counts


def test_parameter_count_formulas():
    assert embedding_parameter_count(50257, 768) == 38_597_376
    assert embedding_parameter_count(50257, 768, context_length=1024) == 38_597_376 + 786_432
    assert embedding_parameter_count(32000, 4096, tied=False) == 2 * 131_072_000
    assert embedding_parameter_count(7, 3, context_length=5, tied=False) == 7 * 3 * 2 + 5 * 3
    with pytest.raises(ValueError, match="d_model must be positive"):
        embedding_parameter_count(10, 0)
    with pytest.raises(ValueError, match="context_length must be positive"):
        embedding_parameter_count(10, 4, context_length=0)
    with pytest.raises(TypeError, match="vocab_size must be an int"):
        embedding_parameter_count(10.5, 4)


def test_parameter_counts_equal_transformers_gpt2_and_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1)  # GPT-2 small's V, d, T_max; one block is enough
    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(cfg)
    wte, wpe = gpt2.transformer.wte.weight, gpt2.transformer.wpe.weight
    assert gpt2.lm_head.weight is wte  # tied
    assert wte.numel() + wpe.numel() == embedding_parameter_count(
        cfg.vocab_size, cfg.n_embd, context_length=cfg.n_positions, tied=True
    )
    assert wte.numel() == embedding_parameter_count(50257, 768)

    lcfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=4096, num_hidden_layers=1, tie_word_embeddings=False
    )
    with torch.device("meta"):
        llama = transformers.LlamaForCausalLM(lcfg)
    head, tok = llama.lm_head.weight, llama.model.embed_tokens.weight
    assert head is not tok
    assert head.numel() + tok.numel() == embedding_parameter_count(32000, 4096, tied=False)


# ---------------------------------------------------------------- nearest_rows


def test_nearest_rows_worked_example():
    E = torch.tensor([[3.0, 4.0], [0.0, 1.0], [1.0, 0.0], [6.0, 8.0], [0.0, 0.5]])  # norms 5, 1, 1, 10, 0.5
    ids, dist = nearest_rows(E, 3)
    assert ids.tolist() == [4, 1, 2] and dist.tolist() == [0.5, 1.0, 1.0]  # tie 1 = 1: smaller id first
    ids, dist = nearest_rows(E, 2, centre=torch.tensor([3.0, 4.0]), exclude=[0])
    assert ids.tolist() == [1, 2] and dist.tolist() == pytest.approx([18**0.5, 20**0.5])
    assert ids.dtype == torch.int64


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 30), st.integers(1, 6), st.integers(0, 10**6), st.booleans())
def test_nearest_rows_equals_a_sort_of_torch_cdist(V, d, seed, with_centre):
    g = torch.Generator().manual_seed(seed)
    E = torch.randn(V, d, generator=g, dtype=torch.float64)  # (V, d), V != d mostly
    centre = torch.randn(d, generator=g, dtype=torch.float64) if with_centre else None
    exclude = list(range(0, V, 3))[: V - 1]
    k = V - len(exclude)
    ids, dist = nearest_rows(E, k, centre=centre, exclude=exclude)
    point = torch.zeros(1, d, dtype=torch.float64) if centre is None else centre[None]
    ref = torch.cdist(E, point)[:, 0]  # (V,)
    expected = sorted((i for i in range(V) if i not in exclude), key=lambda i: (ref[i].item(), i))
    assert set(ids.tolist()) == set(expected) and not set(ids.tolist()) & set(exclude)
    assert torch.allclose(dist, ref[ids], atol=1e-12)
    assert bool((dist[1:] >= dist[:-1]).all())  # nearest first


def test_nearest_rows_bad_input():
    E = torch.zeros(4, 3)
    with pytest.raises(TypeError, match="E must be a floating-point tensor"):
        nearest_rows(E.long(), 1)
    with pytest.raises(ValueError, match=r"E must be a \(V, d\) matrix"):
        nearest_rows(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="k = 4 exceeds the 3 rows left"):
        nearest_rows(E, 4, exclude=[0])
    with pytest.raises(ValueError, match="k must be"):
        nearest_rows(E, 0)
    with pytest.raises(ValueError, match=r"centre must have shape \(3,\)"):
        nearest_rows(E, 1, centre=torch.zeros(4))
    with pytest.raises(ValueError, match="exclude must hold ids in"):
        nearest_rows(E, 1, exclude=[4])


# ---------------------------------------------------------------- TokenEmbedding(scale=...)


@pytest.mark.parametrize(("V", "d"), [(11, 4), (7, 9), (50, 2304)])
def test_scaled_embedding_equals_gemma2s_scaled_word_embedding(V, d):
    from transformers.models.gemma2.modeling_gemma2 import Gemma2TextScaledWordEmbedding

    g = torch.Generator().manual_seed(V + d)
    ours = TokenEmbedding(V, d, generator=g, scale=d**0.5)
    peer = Gemma2TextScaledWordEmbedding(V, d, padding_idx=0, embed_scale=d**0.5)
    peer.weight.data.copy_(ours.weight.data)
    ids = torch.randint(0, V, (3, 5), generator=g)  # (B, T), non-square
    assert torch.equal(ours(ids), peer(ids))  # float32 either way: the same product
    h = torch.randn(3, 5, d, generator=g)
    assert torch.equal(ours.logits(h), h @ ours.weight.T)  # the output use is not scaled
    assert "scale=" in repr(ours) and "scale" not in repr(TokenEmbedding(V, d))


def test_scaled_embedding_worked_example_and_gradient():
    emb = TokenEmbedding(3, 4, dtype=torch.float64, scale=2.0)
    with torch.no_grad():
        emb.weight.copy_(torch.arange(12, dtype=torch.float64).reshape(3, 4))
    assert emb(torch.tensor([[2, 0]])).tolist() == [[[16.0, 18.0, 20.0, 22.0], [0.0, 2.0, 4.0, 6.0]]]
    ids = torch.tensor([[2, 0, 2]])
    W = emb.weight.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda w: torch.func.functional_call(emb, {"weight": w}, (ids,)), (W,))
    emb.zero_grad()
    (emb(ids) * torch.ones(1, 3, 4, dtype=torch.float64)).sum().backward()
    assert emb.weight.grad.tolist() == [[2.0] * 4, [0.0] * 4, [4.0] * 4]  # scale x count


def test_scaled_embedding_bad_scale():
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        TokenEmbedding(3, 4, scale=0.0)
    with pytest.raises(TypeError, match="scale must be a number"):
        TokenEmbedding(3, 4, scale="2")
