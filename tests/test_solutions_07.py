"""The exercise solutions of notebooks/07_decoder hold."""


import math

import pytest
import torch
from solution_loader import load_solutions
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from llmbook.transformer.hf_loading import from_hf, randomize_parameters_
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.transformer.sizing import count_parameters, flops_per_token, flops_shares

solutions = load_solutions("07_decoder")


def test_exercise_1_width_for_budget():
    exact, d = solutions.width_for_budget()
    assert d == 1024 and abs(exact - 1024) < 32
    c = TransformerConfig.gpt2_style(d_model=d, n_layers=24, n_heads=16)
    assert count_parameters(c) == 354_823_168  # GPT-2 medium
    # the exact root meets the budget: N is increasing in d, so N(floor) <= 350M <= N(ceil)
    below = TransformerConfig.gpt2_style(d_model=int(exact), n_layers=24, n_heads=1)
    above = TransformerConfig.gpt2_style(d_model=int(exact) + 1, n_layers=24, n_heads=1)
    assert count_parameters(below) <= 350_000_000 <= count_parameters(above)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_exercise_2_interleaved_rope(family):
    torch.manual_seed(0)
    cls, cfg = (LlamaForCausalLM, LlamaConfig) if family == "llama" else (Qwen2ForCausalLM, Qwen2Config)
    hf = cls(cfg(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
    randomize_parameters_(hf, 0.1, torch.Generator().manual_seed(1))
    half = from_hf(hf).double()
    inter = solutions.interleave_rope(half)
    assert inter.config.rope_interleaved and not half.config.rope_interleaved
    assert not torch.equal(inter.blocks[0].attn.q_proj.weight, half.blocks[0].attn.q_proj.weight)
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(inter(ids), half(ids), rtol=0, atol=1e-12)
    # the permutation is needed: the interleaved pairing with unpermuted weights differs
    wrong = TransformerLM(inter.config).double()
    wrong.load_state_dict(half.state_dict())
    assert (wrong(ids) - half(ids)).abs().max() > 1e-3
    with pytest.raises(ValueError, match="already uses the interleaved pairing"):
        solutions.interleave_rope(inter)


@pytest.mark.parametrize("tied", [True, False])
def test_exercise_3_backward_is_twice_forward(tied):
    c = TransformerConfig.llama_style(vocab_size=50, d_model=32, n_layers=2, n_heads=4,
                                      n_kv_heads=2, max_seq_len=16, tie_embeddings=tied)
    model = TransformerLM(c)
    ids = torch.randint(0, 50, (2, 9))
    forward, both = solutions.training_flops(model, ids)
    assert forward == 2 * 9 * flops_per_token(c, 9)
    assert both == 3 * forward
    model.embed.weight.requires_grad_(False)
    _, frozen = solutions.training_flops(model, ids)
    # untied: the first layer's input gradient is still needed (the norm gains train), so
    # nothing changes; tied: the output layer's weight gradient, 2 d V per token, is skipped
    assert frozen == both - (2 * 9 * 2 * c.d_model * c.vocab_size if tied else 0)


def test_exercise_4_attention_crossover():
    for c in (TransformerConfig.qwen2_style(), TransformerConfig.llama_style()):
        T_star = solutions.attention_crossover(c)
        f = flops_shares(c, 1)
        others = f["total"] - f["attention_scores"]
        assert T_star * 4 * c.n_layers * c.n_heads * c.d_head == others
    q, ll = (float(solutions.attention_crossover(c)) for c in
             (TransformerConfig.qwen2_style(), TransformerConfig.llama_style()))
    assert 11000 < q < 12000 and 25000 < ll < 26000


def test_exercise_5_uniform_bits_per_byte():
    from llmbook.text.corpus import load_stdlib_docs, stdlib_docs_path
    from llmbook.text.tokenizer import BPETokenizer, read_gpt2_files

    text = load_stdlib_docs(max_bytes=20_000)
    ppl, bpb = solutions.uniform_bits_per_byte(text)
    assert ppl == pytest.approx(256, rel=1e-12) and bpb == pytest.approx(8.0, rel=1e-12)
    folder = stdlib_docs_path().parent / "models" / "text"
    tok = BPETokenizer(*read_gpt2_files(folder / "encoder.json", folder / "vocab.bpe")[:2])
    ppl_bpe, bpb_bpe = solutions.uniform_bits_per_byte(text, tok)
    n_tokens = len(tok.encode(text))
    assert ppl_bpe == pytest.approx(1024, rel=1e-12)
    assert bpb_bpe == pytest.approx(10 * n_tokens / len(text.encode()), rel=1e-12)
    assert bpb_bpe < bpb and ppl_bpe > ppl  # higher perplexity per token, fewer bits per byte
    # a text of two-byte characters: bytes per character double, bits per byte stay 8
    assert solutions.uniform_bits_per_byte("é" * 50)[1] == pytest.approx(8.0)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_exercise_6_qk_norm_bounds_the_scores(qk_norm):
    # one layer: with two, the scaled scores of layer 1 change what layer 2 reads (not so
    # with QK-norm, where nothing changes); eps tiny so that the norm is scale-invariant
    c = TransformerConfig.llama_style(vocab_size=53, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                      d_head=12, max_seq_len=16, qk_norm=qk_norm, norm_eps=1e-12)
    model = TransformerLM(c, generator=torch.Generator().manual_seed(0)).double()
    randomize_parameters_(model, 0.1, torch.Generator().manual_seed(1))  # gains away from 1
    ids = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(2))
    base = solutions.max_attention_score(model, ids)
    grown = [solutions.max_attention_score(solutions.scale_queries_and_keys(model, f), ids) for f in (10.0, 100.0)]
    if qk_norm:
        # Cauchy-Schwarz: |q . k| <= |g_q|_inf |g_k|_inf d_h after the norm, times 1/sqrt(d_h)
        attn = model.blocks[0].attn
        bound = attn.q_norm.weight.abs().max().item() * attn.k_norm.weight.abs().max().item() * math.sqrt(12)
        assert max(base, *grown) <= bound
        assert all(abs(s_ - base) < 1e-6 * base for s_ in grown)  # scale-invariant (up to eps)
    else:
        # no bias, no norm between the projections and the scores: they grow as c^2
        assert grown[0] == pytest.approx(100 * base, rel=1e-9)
        assert grown[1] == pytest.approx(10_000 * base, rel=1e-9)


def test_exercise_7_a_soft_cap_bounds_the_loss():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    hf = Gemma2ForCausalLM(Gemma2Config(
        vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=40, rms_norm_eps=0.01,
        query_pre_attn_scalar=24, sliding_window=4, attn_logit_softcapping=2.0, final_logit_softcapping=5.0))
    model = from_hf(randomize_parameters_(hf, 0.1, torch.Generator().manual_seed(1)).eval()).double()
    g = torch.Generator().manual_seed(2)
    ids, targets = torch.randint(0, 101, (2, 13), generator=g), torch.randint(0, 101, (2, 13), generator=g)
    bound = solutions.softcap_loss_bound(101, 5.0)
    assert bound == pytest.approx(math.log(101) + 10.0)
    # the bound is tight: logits at +cap everywhere but -cap at the target approach it
    z = torch.full((1, 101), 5.0, dtype=torch.float64)
    z[0, 7] = -5.0
    assert torch.nn.functional.cross_entropy(z, torch.tensor([7])).item() == \
        pytest.approx(math.log(100 * math.exp(5.0) + math.exp(-5.0)) + 5.0)
    capped = [solutions.worst_token_loss(solutions.scale_output_layer(model, c, 5.0), ids, targets)
              for c in (1.0, 10.0, 100.0)]
    free = [solutions.worst_token_loss(solutions.scale_output_layer(model, c, None), ids, targets)
            for c in (1.0, 10.0, 100.0)]
    assert max(capped) < bound
    assert free[2] > bound and free[2] > 5 * free[0]  # without the cap the worst loss grows with the scale
