"""Checks of chapter 7's exercises (notebooks/07_decoder), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are GPT-2 medium's published parameter count, ``transformers``' Llama, Qwen2 and
Gemma2 (converted with :func:`llmbook.transformer.hf_loading.from_hf`), the book's
FLOP counts (:mod:`llmbook.transformer.sizing`), its BPE tokenizer, and the bounds
(Cauchy-Schwarz, the soft-cap) the exercises derive. ``transformers`` is imported
inside the checks that use it.
"""

from __future__ import annotations

import math

import torch

from llmbook.transformer.hf_loading import from_hf, randomize_parameters_
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.transformer.sizing import count_parameters, flops_per_token, flops_shares
from llmbook.workbench.checks import raises


def exercise_1_width_for_budget(solutions) -> None:
    exact, d = solutions.width_for_budget()
    assert d == 1024 and abs(exact - 1024) < 32, (
        f"expected d_model = 1024 from an exact root within 32 of it, got d = {d!r} from {exact!r}")
    c = TransformerConfig.gpt2_style(d_model=d, n_layers=24, n_heads=16)
    n = count_parameters(c)
    assert n == 354_823_168, f"expected GPT-2 medium's 354,823,168 parameters at d = {d}, got {n:,}"
    # the exact root meets the budget: N is increasing in d, so N(floor) <= 350M <= N(ceil)
    below = count_parameters(TransformerConfig.gpt2_style(d_model=int(exact), n_layers=24, n_heads=1))
    above = count_parameters(TransformerConfig.gpt2_style(d_model=int(exact) + 1, n_layers=24, n_heads=1))
    assert below <= 350_000_000 <= above, (
        f"expected the exact root {exact!r} to bracket 350M: N({int(exact)}) = {below:,}, "
        f"N({int(exact) + 1}) = {above:,}")


def exercise_2_interleaved_rope(solutions) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    for family in ("llama", "qwen2"):
        torch.manual_seed(0)
        cls, cfg = (LlamaForCausalLM, LlamaConfig) if family == "llama" else (Qwen2ForCausalLM, Qwen2Config)
        hf = cls(cfg(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
        randomize_parameters_(hf, 0.1, torch.Generator().manual_seed(1))
        half = from_hf(hf).double()
        inter = solutions.interleave_rope(half)
        copy_flag, original_flag = inter.config.rope_interleaved, half.config.rope_interleaved
        assert copy_flag and not original_flag, (
            f"expected the copy to use the interleaved pairing and the original not ({family}), "
            f"got rope_interleaved = {copy_flag!r} and {original_flag!r}")
        assert not torch.equal(inter.blocks[0].attn.q_proj.weight, half.blocks[0].attn.q_proj.weight), (
            f"expected the query weights to be permuted ({family})")
        ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(2))
        error = (inter(ids) - half(ids)).abs().max().item()
        assert torch.allclose(inter(ids), half(ids), rtol=0, atol=1e-12), (
            f"expected the interleaved copy to give the same logits ({family}, to 1e-12), "
            f"largest difference {error:.3g}")
        # the permutation is needed: the interleaved pairing with unpermuted weights differs
        wrong = TransformerLM(inter.config).double()
        wrong.load_state_dict(half.state_dict())
        off = (wrong(ids) - half(ids)).abs().max().item()
        assert off > 1e-3, f"the unpermuted weights should change the logits ({family}), moved by {off:.3g}"
        with raises(ValueError, match="already uses the interleaved pairing",
                    what="interleave_rope on an interleaved model"):
            solutions.interleave_rope(inter)


def exercise_3_backward_is_twice_forward(solutions) -> None:
    for tied in (True, False):
        c = TransformerConfig.llama_style(vocab_size=50, d_model=32, n_layers=2, n_heads=4,
                                          n_kv_heads=2, max_seq_len=16, tie_embeddings=tied)
        model = TransformerLM(c)
        ids = torch.randint(0, 50, (2, 9))
        forward, both = solutions.training_flops(model, ids)
        want = 2 * 9 * flops_per_token(c, 9)
        assert forward == want, f"expected {want} forward FLOPs (tied={tied}), got {forward!r}"
        assert both == 3 * forward, f"expected forward + backward = 3 x {forward} (tied={tied}), got {both!r}"
        model.embed.weight.requires_grad_(False)
        _, frozen = solutions.training_flops(model, ids)
        # untied: the first layer's input gradient is still needed (the norm gains train), so
        # nothing changes; tied: the output layer's weight gradient, 2 d V per token, is skipped
        want = both - (2 * 9 * 2 * c.d_model * c.vocab_size if tied else 0)
        assert frozen == want, f"expected {want} FLOPs with the embedding frozen (tied={tied}), got {frozen!r}"


def exercise_4_attention_crossover(solutions) -> None:
    for c in (TransformerConfig.qwen2_style(), TransformerConfig.llama_style()):
        T_star = solutions.attention_crossover(c)
        f = flops_shares(c, 1)
        others = f["total"] - f["attention_scores"]
        scores = T_star * 4 * c.n_layers * c.n_heads * c.d_head
        assert scores == others, (
            f"expected the scores' FLOPs at T* = {T_star} to equal the rest, {others}, got {scores}")
    q, ll = (float(solutions.attention_crossover(c)) for c in
             (TransformerConfig.qwen2_style(), TransformerConfig.llama_style()))
    assert 11000 < q < 12000 and 25000 < ll < 26000, (
        f"expected T* between 11,000 and 12,000 (Qwen2 style) and 25,000 and 26,000 (Llama style), "
        f"got {q:.6g} and {ll:.6g}")


def exercise_5_uniform_bits_per_byte(solutions) -> None:
    from llmbook.text.corpus import load_stdlib_docs, stdlib_docs_path
    from llmbook.text.tokenizer import BPETokenizer, read_gpt2_files

    text = load_stdlib_docs(max_bytes=20_000)
    ppl, bpb = solutions.uniform_bits_per_byte(text)
    assert abs(ppl - 256) <= 1e-12 * 256 and abs(bpb - 8.0) <= 1e-12 * 8.0, (
        f"expected perplexity 256 and 8 bits per byte over bytes (to 1e-12 relative), got {ppl!r}, {bpb!r}")
    folder = stdlib_docs_path().parent / "models" / "text"
    tok = BPETokenizer(*read_gpt2_files(folder / "encoder.json", folder / "vocab.bpe")[:2])
    ppl_bpe, bpb_bpe = solutions.uniform_bits_per_byte(text, tok)
    n_tokens = len(tok.encode(text))
    assert abs(ppl_bpe - 1024) <= 1e-12 * 1024, (
        f"expected perplexity 1024 over the 1024-token BPE (to 1e-12 relative), got {ppl_bpe!r}")
    want = 10 * n_tokens / len(text.encode())
    assert abs(bpb_bpe - want) <= max(1e-12 * want, 1e-12), (
        f"expected 10 bits x {n_tokens} tokens / {len(text.encode())} bytes = {want!r} bits per byte, "
        f"got {bpb_bpe!r}")
    assert bpb_bpe < bpb and ppl_bpe > ppl, (  # higher perplexity per token, fewer bits per byte
        f"expected the BPE model to have a higher perplexity ({ppl_bpe!r} vs {ppl!r}) and fewer bits "
        f"per byte ({bpb_bpe!r} vs {bpb!r})")
    # a text of two-byte characters: bytes per character double, bits per byte stay 8
    two_byte = solutions.uniform_bits_per_byte("é" * 50)[1]
    assert abs(two_byte - 8.0) <= 8e-6, f"expected 8 bits per byte on 'é' * 50 (to 1e-6 relative), got {two_byte!r}"


def exercise_6_qk_norm_bounds_the_scores(solutions) -> None:
    for qk_norm in (False, True):
        # one layer: with two, the scaled scores of layer 1 change what layer 2 reads (not so
        # with QK-norm, where nothing changes); eps tiny so that the norm is scale-invariant
        c = TransformerConfig.llama_style(vocab_size=53, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                          d_head=12, max_seq_len=16, qk_norm=qk_norm, norm_eps=1e-12)
        model = TransformerLM(c, generator=torch.Generator().manual_seed(0)).double()
        randomize_parameters_(model, 0.1, torch.Generator().manual_seed(1))  # gains away from 1
        ids = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(2))
        base = solutions.max_attention_score(model, ids)
        grown = [solutions.max_attention_score(solutions.scale_queries_and_keys(model, f), ids)
                 for f in (10.0, 100.0)]
        if qk_norm:
            # Cauchy-Schwarz: |q . k| <= |g_q|_inf |g_k|_inf d_h after the norm, times 1/sqrt(d_h)
            attn = model.blocks[0].attn
            bound = attn.q_norm.weight.abs().max().item() * attn.k_norm.weight.abs().max().item() * math.sqrt(12)
            largest = max(base, *grown)
            assert largest <= bound, (
                f"expected every score within the Cauchy-Schwarz bound {bound:.6g} with QK-norm, got {largest!r}")
            assert all(abs(s_ - base) < 1e-6 * base for s_ in grown), (  # scale-invariant (up to eps)
                f"expected the largest score to stay {base!r} (to 1e-6 relative) with W_Q, W_K x 10 and "
                f"x 100 under QK-norm, got {grown}")
        else:
            # no bias, no norm between the projections and the scores: they grow as c^2
            for f, got in zip((10.0, 100.0), grown, strict=True):
                want = f * f * base
                assert abs(got - want) <= max(1e-9 * abs(want), 1e-12), (
                    f"expected the largest score to grow as c^2 without QK-norm: {want!r} at c = {f:g} "
                    f"(to 1e-9 relative), got {got!r}")


def exercise_7_a_soft_cap_bounds_the_loss(solutions) -> None:
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
    want = math.log(101) + 10.0
    assert abs(bound - want) <= 1e-6 * want, f"expected log V + 2 cap = {want!r} for V = 101, cap 5, got {bound!r}"
    # the bound is tight: logits at +cap everywhere but -cap at the target approach it
    z = torch.full((1, 101), 5.0, dtype=torch.float64)
    z[0, 7] = -5.0
    tight = torch.nn.functional.cross_entropy(z, torch.tensor([7])).item()
    want = math.log(100 * math.exp(5.0) + math.exp(-5.0)) + 5.0
    assert abs(tight - want) <= 1e-6 * want, f"F.cross_entropy at the extreme logits is {tight!r}, not {want!r}"
    capped = [solutions.worst_token_loss(solutions.scale_output_layer(model, c, 5.0), ids, targets)
              for c in (1.0, 10.0, 100.0)]
    free = [solutions.worst_token_loss(solutions.scale_output_layer(model, c, None), ids, targets)
            for c in (1.0, 10.0, 100.0)]
    assert max(capped) < bound, (
        f"expected the capped model's worst token loss below the bound {bound!r} at scales 1, 10, 100, got {capped}")
    assert free[2] > bound and free[2] > 5 * free[0], (  # without the cap the worst loss grows with the scale
        f"expected the uncapped worst loss at scale 100 above the bound {bound!r} and 5 x its value at "
        f"scale 1, got {free}")
