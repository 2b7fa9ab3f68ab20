"""``to_hf_llama``: a book model handed to transformers' own ``LlamaForCausalLM``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.transformer.hf_loading import from_hf, randomize_parameters_, to_hf_llama
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")


def _book(seed: int = 0, **overrides) -> TransformerLM:
    kw = dict(vocab_size=97, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, d_ff=80, max_seq_len=64)
    kw.update(overrides)
    torch.manual_seed(seed)
    model = TransformerLM(TransformerConfig.llama_style(**kw)).double()
    randomize_parameters_(model)
    return model.eval()


def _logit_gap(model: TransformerLM, hf: torch.nn.Module, seed: int = 1) -> float:
    ids = torch.randint(0, model.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return (model(ids) - hf(ids).logits).abs().max().item()


# transformers computes the rotary angles in float32 whatever the model's dtype, so float64
# logits agree to about 1e-7 (measured 5e-7 at most), not to float64's round-off
TOL = 1e-5


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_logits_equal_transformers_llama(tied, bias, interleaved):
    model = _book(tie_embeddings=tied, attn_bias=bias, mlp_bias=bias, rope_interleaved=interleaved)
    hf = to_hf_llama(model)
    assert type(hf).__name__ == "LlamaForCausalLM" and not hf.training
    assert next(hf.parameters()).dtype == torch.float64
    assert _logit_gap(model, hf) < TOL
    # tied weights stay tied in transformers' model (one tensor), untied ones do not
    assert (hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()) == tied


def test_the_interleaved_rows_are_reordered_not_copied():
    """Without the reordering, an interleaved model's logits differ from transformers' (the
    check above could not pass by accident)."""
    model = _book(rope_interleaved=True)
    plain = _book(rope_interleaved=False)
    plain.load_state_dict(model.state_dict())
    hf = to_hf_llama(plain)  # the same tensors, no reordering
    assert _logit_gap(model, hf) > 1e-2


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), heads=st.sampled_from([(4, 1), (4, 2), (6, 3), (2, 2)]),
       d_head=st.sampled_from([4, 8, 10]))
def test_round_trip_through_from_hf_is_exact(seed, heads, d_head):
    n_heads, n_kv = heads
    model = _book(seed, d_model=2 * n_heads * d_head, n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head,
                  n_layers=2, d_ff=24)
    back = from_hf(to_hf_llama(model))
    assert back.config.d_head == d_head and back.config.n_kv_heads == n_kv
    theirs = back.state_dict()
    assert set(theirs) == set(model.state_dict())
    assert all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items())
    # the copy is not shared: changing the export leaves the book model alone
    hf = to_hf_llama(model)
    with torch.no_grad():
        hf.model.embed_tokens.weight.zero_()
    assert model.embed.weight.abs().sum() > 0


def test_smollm2_equals_transformers_own_gguf_load(smollm2_peer):
    """The book's GGUF reader, un-permuted by to_hf_llama, gives bit for bit the tensors that
    transformers' own GGUF reader gives (its dequantiser and its reverse permutation)."""
    from llmbook.inference.gguf import load_model

    model, _ = load_model()
    ours = to_hf_llama(model).state_dict()
    theirs = smollm2_peer[0].state_dict()
    assert set(ours) == set(theirs) and len(ours) == 273
    different = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert different == []


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="TransformerLM"):
        to_hf_llama(torch.nn.Linear(2, 2))
    gpt2 = TransformerLM(TransformerConfig.gpt2_style(vocab_size=11, d_model=8, n_layers=1, n_heads=2,
                                                      max_seq_len=8))
    with pytest.raises(ValueError, match="norm='rmsnorm'"):
        to_hf_llama(gpt2)
    for overrides, name in ((dict(qk_norm=True), "qk_norm"), (dict(sliding_window=4), "sliding_window"),
                            (dict(attn_softcap=30.0), "attn_softcap"), (dict(embed_scale=2.0), "embed_scale")):
        with pytest.raises(ValueError, match=name):
            to_hf_llama(_book(**overrides))
    with pytest.raises(ValueError, match="d_model divisible by n_heads"):
        to_hf_llama(_book(d_model=50, n_heads=6, n_kv_heads=2, d_head=8))
    with pytest.raises(ValueError, match="qkv_bias=True and out_bias=False"):
        to_hf_llama(_book(qkv_bias=True, out_bias=False))
