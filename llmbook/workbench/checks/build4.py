"""Checks of the build-it-yourself unit of Part IV (inference), run on ``solutions``.

The reader builds temperature, top-p and top-k filtering, a KV cache with an attention step
over it, absmax int8 quantisation and NF4 (the reference, the book's code plugged in, is
``llmbook/workbench/units/build4_inference.py``). The peers: ``transformers``'
``TemperatureLogitsWarper``, ``TopPLogitsWarper`` and ``TopKLogitsWarper`` (imported inside
the checks that use them), full causal attention recomputed by
``torch.nn.functional.scaled_dot_product_attention``, ``torch.quantize_per_channel``,
QLoRA's published NF4 table (the values bitsandbytes ships), and the book's own sampler,
cache and quantisers (:mod:`llmbook.inference`). The last exercise runs the reader's pieces
together on the book's shipped text model.
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F

from llmbook.workbench.checks import raises

f64 = torch.float64

#: The exercises of the unit: number -> (stars, title), in build order.
EXERCISES = {
    1: (2, "Temperature and top-p (nucleus) filtering"),
    2: (1, "Top-k filtering"),
    3: (2, "A KV cache and one attention step over it"),
    4: (1, "Absmax int8 quantisation per row and per block"),
    5: (2, "NF4: the NormalFloat levels and blockwise quantisation"),
    6: (3, "End to end: decode the book's model with your cache, filters and quantisers"),
}

#: QLoRA's NF4 table as published (Dettmers et al., 2023, Appendix E; bitsandbytes' values).
NF4_PUBLISHED = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)


def _logits(V: int, scale: float) -> torch.Tensor:
    """(6, V) float64 normal logits without ties, from flat (0.3) to peaked (4)."""
    g = torch.Generator().manual_seed(V * 100 + int(10 * scale))
    return torch.randn(6, V, generator=g, dtype=f64) * scale


def _tied(V: int, seed: int) -> torch.Tensor:
    """(4, V) logits with five distinct values: every boundary is a tie."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 5, (4, V), generator=g).double() * 0.7


def _kept(z: torch.Tensor) -> list[int]:
    return torch.isfinite(z).sum(-1).tolist()


def _lowest_index_ties(kept: torch.Tensor, z: torch.Tensor) -> bool:
    """Whether, in every row, the tied tokens at the boundary that are kept are those of
    lowest index (and every token above the boundary is kept)."""
    for r in range(z.shape[0]):
        boundary = z[r][kept[r]].min()
        if not bool(kept[r][z[r] > boundary].all()):
            return False
        tied = kept[r][z[r] == boundary].tolist()
        n = sum(tied)
        if tied != [True] * n + [False] * (len(tied) - n):
            return False
    return True


# ---------------------------------------------------------------- 1. temperature and top-p


def exercise_1_temperature_and_top_p_are_transformers_warpers(solutions) -> None:
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    for V in (32, 97):
        for scale in (0.3, 1.5, 4.0):
            z = _logits(V, scale)
            before = z.clone()
            for t in (0.5, 2.0):
                warm = solutions.apply_temperature(z, t)
                theirs = TemperatureLogitsWarper(t)(None, z.clone())
                assert torch.equal(warm, theirs), (
                    f"V = {V}, scale {scale}: expected apply_temperature(z, {t}) to equal "
                    f"transformers' TemperatureLogitsWarper (z / T) exactly, largest difference "
                    f"{(warm - theirs).abs().max().item():.3g}")
                for p in (0.3, 0.6, 0.9, 0.95):
                    ours = solutions.top_p_filter(warm, p)
                    theirs = TopPLogitsWarper(p)(None, warm.clone())
                    assert torch.equal(ours, theirs), (
                        f"V = {V}, scale {scale}, T = {t}, p = {p}: expected top_p_filter to equal "
                        f"transformers' TopPLogitsWarper exactly; it keeps {_kept(theirs)} tokens per "
                        f"row, yours {_kept(ours)}")
            assert torch.equal(z, before), "expected the logits passed in to be left unchanged"


def exercise_1_top_p_edges_ties_and_bad_input(solutions) -> None:
    from transformers.generation.logits_process import TopPLogitsWarper

    z = _logits(97, 1.5)
    one = _kept(solutions.top_p_filter(z, 1e-9))
    assert one == [1] * 6, f"expected a tiny p to keep the most likely token alone, kept {one} per row"
    best = torch.isfinite(solutions.top_p_filter(z, 1e-9)).float().argmax(-1)
    assert torch.equal(best, z.argmax(-1)), (
        f"expected the one token kept to be the arg max {z.argmax(-1).tolist()}, got {best.tolist()}")
    every = solutions.top_p_filter(z, 1.0)
    assert torch.equal(every, z), "expected p = 1 to keep every logit unchanged"
    layered = solutions.top_p_filter(z.reshape(2, 3, 97), 0.8)
    assert layered.shape == (2, 3, 97) and torch.equal(layered.reshape(6, 97), solutions.top_p_filter(z, 0.8)), (
        "expected a (2, 3, V) input to be filtered row by row, like the same rows as (6, V)")
    # ties: the same number as transformers, the lowest indices among the tied tokens
    for V in (32, 64, 257):
        zt = _tied(V, 7 * V)
        for p in (0.31, 0.58, 0.87):
            ours = torch.isfinite(solutions.top_p_filter(zt, p))
            theirs = torch.isfinite(TopPLogitsWarper(p)(None, zt.clone()))
            assert torch.equal(ours.sum(-1), theirs.sum(-1)), (
                f"ties, V = {V}, p = {p}: expected as many tokens kept as TopPLogitsWarper, "
                f"{theirs.sum(-1).tolist()} per row, got {ours.sum(-1).tolist()}")
            assert _lowest_index_ties(ours, zt), (
                f"ties, V = {V}, p = {p}: expected the tied tokens kept at the boundary to be those "
                f"of lowest index (sort with stable=True)")
    for bad in (0.0, -0.1, 1.5):
        with raises(ValueError, what=f"top_p_filter(z, {bad})"):
            solutions.top_p_filter(z, bad)
    for bad in (0.0, -1.0):
        with raises(ValueError, what=f"apply_temperature(z, {bad})"):
            solutions.apply_temperature(z, bad)


# ---------------------------------------------------------------- 2. top-k


def exercise_2_top_k(solutions) -> None:
    from transformers.generation.logits_process import TopKLogitsWarper

    for V in (32, 97):
        for scale in (0.3, 4.0):
            z = _logits(V, scale)
            before = z.clone()
            for k in (1, 5, 24, V - 1):
                ours = solutions.top_k_filter(z, k)
                theirs = TopKLogitsWarper(k)(None, z.clone())
                assert torch.equal(ours, theirs), (
                    f"V = {V}, k = {k}: expected top_k_filter to equal transformers' TopKLogitsWarper "
                    f"exactly; it keeps {_kept(theirs)} tokens per row, yours {_kept(ours)}")
            assert torch.equal(z, before), "expected the logits passed in to be left unchanged"
            for k in (V, V + 5):
                assert torch.equal(solutions.top_k_filter(z, k), z), f"expected k = {k} >= V = {V} to keep everything"
    for V in (17, 64, 257):  # at V >= 17 torch's default sort no longer keeps tied tokens in order
        zt = _tied(V, V)
        for k in (1, 3, V // 3, V - 2):
            kept = torch.isfinite(solutions.top_k_filter(zt, k))
            assert kept.sum(-1).tolist() == [k] * 4, (
                f"ties, V = {V}: expected exactly k = {k} kept per row, got {kept.sum(-1).tolist()}")
            assert _lowest_index_ties(kept, zt), (
                f"ties, V = {V}, k = {k}: expected the tied tokens kept at the boundary to be those of "
                f"lowest index (sort with stable=True)")
    with raises(ValueError, what="top_k_filter(z, 0)"):
        solutions.top_k_filter(_logits(32, 1.5), 0)


# ---------------------------------------------------------------- 3. KV cache


def _full_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                          is_causal=True)


def exercise_3_cached_attention_equals_full_causal_attention(solutions) -> None:
    g = torch.Generator().manual_seed(3)
    B, H, H_kv, T, d = 2, 6, 2, 13, 8
    layers = [[torch.randn(B, h, T, d, generator=g, dtype=f64) for h in (H, H_kv, H_kv)] for _ in range(2)]
    cache = solutions.KVCache(2, B, H_kv, 16, d, dtype=f64)
    assert cache.length == 0, f"expected a new cache to have length 0, got {cache.length!r}"
    pieces: list[list[torch.Tensor]] = [[], []]
    for a, b in ((0, 5), (5, 6), (6, 9), (9, 13)):  # a prompt, one token, then blocks
        for layer, (q, k, v) in enumerate(layers):
            out = solutions.cached_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], cache, layer)
            assert tuple(out.shape) == (B, H, b - a, d), (
                f"expected cached_attention to return (B, H, T, d_head) = {(B, H, b - a, d)}, got "
                f"{tuple(out.shape)}")
            pieces[layer].append(out)
        assert cache.length == a, (
            f"expected cached_attention to leave the length at {a} (the caller advances), got {cache.length}")
        cache.advance(b - a)
    assert cache.length == T, f"expected the cache to hold {T} positions after advancing, got {cache.length}"
    for layer, (q, k, v) in enumerate(layers):
        got, want = torch.cat(pieces[layer], dim=2), _full_causal(q, k, v)
        error = (got - want).abs().max().item()
        assert error <= 1e-12, (
            f"layer {layer}: expected decoding in pieces with the cache to equal full causal attention "
            f"over the {T} positions (to 1e-12), largest difference {error:.3g}; per position "
            f"{[float(f'{e:.2g}') for e in (got - want).abs().amax(dim=(0, 1, 3)).tolist()]}")


def exercise_3_kv_cache_stores_and_returns_everything(solutions) -> None:
    g = torch.Generator().manual_seed(4)
    cache = solutions.KVCache(3, 2, 3, 10, 4, dtype=f64)
    k1, v1 = torch.randn(2, 3, 6, 4, generator=g, dtype=f64), torch.randn(2, 3, 6, 4, generator=g, dtype=f64)
    keys, values = cache.update(1, k1, v1)
    assert torch.equal(keys, k1) and torch.equal(values, v1), (
        f"expected update on an empty cache to return the keys and values written, got shapes "
        f"{tuple(keys.shape)} and {tuple(values.shape)}")
    assert cache.length == 0, f"expected update to leave length at 0 (advance moves it), got {cache.length}"
    cache.advance(6)
    k2, v2 = torch.randn(2, 3, 1, 4, generator=g, dtype=f64), torch.randn(2, 3, 1, 4, generator=g, dtype=f64)
    keys, values = cache.update(1, k2, v2)
    assert tuple(keys.shape) == (2, 3, 7, 4), f"expected 7 cached keys (6 + 1), got shape {tuple(keys.shape)}"
    assert torch.equal(keys, torch.cat([k1, k2], 2)) and torch.equal(values, torch.cat([v1, v2], 2)), (
        "expected update to return the 6 cached keys and values followed by the new one")
    cache.advance(1)
    with raises(ValueError, what="update of 4 positions at length 7 in a cache of max_seq_len 10"):
        cache.update(0, torch.zeros(2, 3, 4, 4, dtype=f64), torch.zeros(2, 3, 4, 4, dtype=f64))


def exercise_3_kv_cache_inside_the_books_model(solutions) -> None:
    from llmbook.transformer.model import TransformerConfig, TransformerLM

    c = TransformerConfig.llama_style(vocab_size=61, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2,
                                      max_seq_len=32)
    model = TransformerLM(c, generator=torch.Generator().manual_seed(1)).double().eval()
    ids = torch.randint(0, 61, (2, 17), generator=torch.Generator().manual_seed(2))
    cache = solutions.KVCache(c.n_layers, 2, c.n_kv_heads, 20, c.d_head, dtype=f64)
    with torch.no_grad():
        full = model(ids)  # (2, 17, V)
        pieces = torch.cat([model(ids[:, a:b], cache=cache) for a, b in ((0, 7), (7, 8), (8, 12), (12, 17))], 1)
    error = (pieces - full).abs().max().item()
    assert error <= 1e-10, (
        f"expected a Llama-style model (GQA, RoPE) fed in pieces with your cache to give the logits of "
        f"the whole sequence (to 1e-10), largest difference {error:.3g}")
    assert cache.length == 17, f"expected the model to leave your cache at length 17, got {cache.length}"


# ---------------------------------------------------------------- 4. absmax int8


def exercise_4_absmax_int8(solutions) -> None:
    from llmbook.inference.quant import dequantize, quantize_absmax

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5, 48, generator=g, dtype=f64) * torch.logspace(-3, 2, 5, dtype=f64)[:, None]
    x[1, 2] = 0.0  # an all-zero row: scale 1, codes 0
    for block in (None, 16):
        q, scale = solutions.absmax_quantize(x, block)
        blocks = 1 if block is None else 48 // block
        assert q.dtype == torch.int8 and q.shape == x.shape, (
            f"block_size {block}: expected int8 codes of shape {tuple(x.shape)}, got {q.dtype} {tuple(q.shape)}")
        assert scale.dtype == f64 and tuple(scale.shape) == (3, 5, blocks), (
            f"block_size {block}: expected float64 scales of shape {(3, 5, blocks)}, got {scale.dtype} "
            f"{tuple(scale.shape)}")
        book = quantize_absmax(x, 8, group_size=block or 48)
        want = book.scale.squeeze(-1)
        rel = ((scale - want).abs() / want).max().item()
        assert rel <= 1e-12, (
            f"block_size {block}: expected the scales max|x| / 127 per block (1 for an all-zero block) to "
            f"1e-12 relative, largest relative difference {rel:.3g}")
        wrong = int((q.to(torch.int32) != book.q).sum())
        assert wrong == 0, (
            f"block_size {block}: expected the codes round(x / scale) of the book's quantize_absmax, "
            f"{wrong} of {x.numel()} differ")
        back = solutions.absmax_dequantize(q, scale)
        error = (back - dequantize(book)).abs().max().item()
        assert back.shape == x.shape and error <= 1e-12, (
            f"block_size {block}: expected absmax_dequantize to give scale x q (to 1e-12), largest "
            f"difference {error:.3g}")
        step = scale.repeat_interleave(48 // blocks, dim=-1)
        assert bool(((back - x).abs() <= step / 2 * (1 + 1e-12)).all()), (
            f"block_size {block}: expected every dequantised value within half a step of x")
    with raises(ValueError, what="absmax_quantize with a block_size (20) that does not divide 48"):
        solutions.absmax_quantize(x, 20)


def exercise_4_absmax_int8_is_torch_quantize_per_channel(solutions) -> None:
    for seed in range(3):
        x = torch.randn(7, 96, generator=torch.Generator().manual_seed(10 + seed))  # float32: torch's dtype
        for block in (None, 32):
            q, scale = solutions.absmax_quantize(x, block)
            width = block or 96
            flat = x.reshape(-1, width)  # one channel per block
            with warnings.catch_warnings():  # torch marks its quantized tensors deprecated
                warnings.simplefilter("ignore", UserWarning)
                peer = torch.quantize_per_channel(flat, scale.reshape(-1).double(),
                                                  torch.zeros(flat.shape[0], dtype=torch.long), 0, torch.qint8)
                codes, values = peer.int_repr().reshape(q.shape), peer.dequantize().reshape(x.shape)
            wrong = int((codes != q).sum())
            assert wrong == 0, (
                f"float32, block_size {block}: expected the codes torch.quantize_per_channel gives with your "
                f"scales, {wrong} of {q.numel()} differ")
            back = solutions.absmax_dequantize(q, scale)
            error = ((back - values).abs() / scale.abs().max()).max().item()
            assert error <= 1e-6, (
                f"float32, block_size {block}: expected absmax_dequantize to equal torch's dequantize (to "
                f"1e-6 of the largest scale), largest difference {error:.3g} of it")


# ---------------------------------------------------------------- 5. NF4


def exercise_5_nf4_levels_are_qlora_table(solutions) -> None:
    levels = solutions.nf4_levels()
    assert levels.dtype == f64 and tuple(levels.shape) == (16,), (
        f"expected 16 float64 levels, got {levels.dtype} of shape {tuple(levels.shape)}")
    published = torch.tensor(NF4_PUBLISHED, dtype=f64)
    error = (levels - published).abs().max().item()
    assert error <= 1e-6, (
        f"expected the levels of QLoRA's published NF4 table (to 1e-6), largest difference {error:.3g}; "
        f"got {[round(v, 4) for v in levels.tolist()]}")
    assert levels[0].item() == -1.0 and levels[7].item() == 0.0 and levels[15].item() == 1.0, (
        f"expected -1, 0 and 1 exactly at positions 0, 7 and 15, got {levels[0].item()!r}, "
        f"{levels[7].item()!r}, {levels[15].item()!r}")


def exercise_5_nf4_quantize(solutions) -> None:
    from llmbook.inference.quant import quantize_nf4

    published = torch.tensor(NF4_PUBLISHED, dtype=f64)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 3, 128, generator=g, dtype=f64) * 0.02
    x[2, 1, 64:] = 0.0  # an all-zero block
    for block in (64, 32):
        got = solutions.nf4_quantize(x, block)
        assert got.dtype == f64 and got.shape == x.shape, (
            f"block_size {block}: expected float64 of shape {tuple(x.shape)}, got {got.dtype} {tuple(got.shape)}")
        xb = x.reshape(4, 3, 128 // block, block)
        amax = xb.abs().amax(-1, keepdim=True)
        amax = torch.where(amax > 0, amax, torch.ones_like(amax))
        gotb = got.reshape(xb.shape)
        error = ((gotb - quantize_nf4(x, block).reshape(xb.shape)).abs() / amax).max().item()
        assert error <= 1e-12, (
            f"block_size {block}: expected the book's quantize_nf4 (to 1e-12 x block absmax), largest "
            f"difference {error:.3g} x absmax")
        # the peer: each value / its block's absmax rounded to the nearest published level
        nearest = published[((xb / amax)[..., None] - published).abs().argmin(-1)] * amax
        error = ((gotb - nearest) / amax).abs().max().item()
        assert error <= 1e-6, (
            f"block_size {block}: expected each value to become the nearest level of QLoRA's table times "
            f"its block's absmax (to 1e-6 x absmax), largest difference {error:.3g} x absmax")
    assert bool((solutions.nf4_quantize(x, 64)[2, 1, 64:] == 0).all()), "expected an all-zero block to stay zero"
    with raises(ValueError, what="nf4_quantize with a block_size (48) that does not divide 128"):
        solutions.nf4_quantize(x, 48)


# ---------------------------------------------------------------- 6. end to end


def _greedy_with_cache(model, prompt: torch.Tensor, n: int, cache) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Greedy decoding of ``n`` tokens, the model fed through ``cache`` one token at a time."""
    ids, steps = prompt, []
    logits = model(prompt, cache=cache)[:, -1]  # the prefill: (B, V)
    for step in range(n):
        steps.append(logits)
        nxt = logits.argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], 1)
        if step < n - 1:
            logits = model(nxt[:, None], cache=cache)[:, -1]
    return ids, steps


def exercise_6_end_to_end_on_the_books_model(solutions) -> None:
    from llmbook.alignment.lora import quantize_frozen_nf4
    from llmbook.inference.quant import fake_quantize
    from llmbook.inference.sampling import generate, process_logits, sample_categorical
    from llmbook.training.pretrained import book_model

    base, _ = book_model("text")
    model = base.double().eval()
    c = model.config
    prompt = torch.randint(0, c.vocab_size, (2, 6), generator=torch.Generator().manual_seed(7))
    n = 8

    def new_cache():
        return solutions.KVCache(c.n_layers, 2, c.n_kv_heads, 6 + n, c.d_head, dtype=f64)

    with torch.no_grad():
        # (a) greedy decoding with your cache = recomputing the whole sequence at every step
        ids, steps = _greedy_with_cache(model, prompt, n, new_cache())
        for step in range(n):
            full = model(ids[:, :6 + step])[:, -1]
            error = (steps[step] - full).abs().max().item()
            assert error <= 1e-9, (
                f"greedy step {step}: expected the logits with your cache to equal recomputing the "
                f"{6 + step} tokens (to 1e-9), largest difference {error:.3g}")
        book = generate(model, prompt, n, temperature=0, use_cache=False)
        assert torch.equal(ids, book), (
            f"expected greedy decoding with your cache to give the book's tokens {book[:, 6:].tolist()}, "
            f"got {ids[:, 6:].tolist()}")
        # (b) sampling: your temperature, top-k and top-p, in Hugging Face's order, then the
        # book's draw with a seeded generator = the book's sampler, token for token
        t, k, p = 0.8, 40, 0.9
        g = torch.Generator().manual_seed(8)
        cache, ids = new_cache(), prompt
        logits = model(prompt, cache=cache)[:, -1]
        for step in range(n):
            z = solutions.top_p_filter(solutions.top_k_filter(solutions.apply_temperature(logits, t), k), p)
            want = process_logits(logits, temperature=t, top_k=k, top_p=p)
            assert torch.equal(z, want), (
                f"sampling step {step}: expected apply_temperature, top_k_filter and top_p_filter in turn "
                f"to give the logits of the book's sampler exactly; it keeps {_kept(want)} tokens per row, "
                f"yours {_kept(z)}")
            nxt = sample_categorical(torch.softmax(z.double(), -1), g)
            ids = torch.cat([ids, nxt[:, None]], 1)
            if step < n - 1:
                logits = model(nxt[:, None], cache=cache)[:, -1]
        book = generate(model, prompt, n, temperature=t, top_k=k, top_p=p,
                        generator=torch.Generator().manual_seed(8))
        assert torch.equal(ids, book), (
            f"expected sampling with your filters (T = {t}, top-k {k}, top-p {p}) and a generator seeded "
            f"8 to draw the book's tokens {book[:, 6:].tolist()}, got {ids[:, 6:].tolist()}")
        # (c) the model's linear weights in NF4 (blocks of 64) and in int8 (per row), by your
        # quantisers and by the book's: the same logits, and greedy decoding the same tokens
        for name in ("NF4", "int8"):
            yours, theirs = copy.deepcopy(model), copy.deepcopy(model)
            for module in yours.modules():
                if isinstance(module, torch.nn.Linear):
                    w = module.weight
                    w.copy_(solutions.nf4_quantize(w, 64) if name == "NF4"
                            else solutions.absmax_dequantize(*solutions.absmax_quantize(w)))
            if name == "NF4":
                quantize_frozen_nf4(theirs, 64)
            else:
                for module in theirs.modules():
                    if isinstance(module, torch.nn.Linear):
                        module.weight.copy_(fake_quantize(module.weight, 8, dim=0, symmetric=True))
            ids, steps = _greedy_with_cache(yours, prompt, n, new_cache())
            book = generate(theirs, prompt, n, temperature=0)
            assert torch.equal(ids, book), (
                f"expected greedy decoding of the {name} model (your quantiser, your cache) to give the "
                f"book's tokens {book[:, 6:].tolist()}, got {ids[:, 6:].tolist()}")
            error = (yours(ids) - theirs(ids)).abs().max().item()
            assert error <= 1e-9, (
                f"expected the {name} model quantised by your code to give the logits of the book's "
                f"(to 1e-9), largest difference {error:.3g}")
            moved = (yours(ids) - model(ids)).abs().max().item()
            assert moved > 1e-4, f"expected {name} to change the logits, they moved by {moved:.3g}"
