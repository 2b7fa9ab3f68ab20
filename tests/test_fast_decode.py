"""Weight-only int4/int8 layers, the static cache and the compiled decode step (llmbook.inference.fast_decode)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen, randn

from llmbook.inference.fast_decode import (
    Int4Linear,
    Int8Linear,
    StaticKVCache,
    compiled_decode_step,
    decode_bytes_per_token,
    decode_step,
    profile_decode_step,
    quantize_for_decode,
    stream_bandwidth,
)
from llmbook.inference.ggml_quants import dequantize
from llmbook.inference.gguf import read_gguf, smollm2_path
from llmbook.inference.kvcache import KVCache
from llmbook.inference.sampling import generate
from llmbook.transformer.model import TransformerConfig, TransformerLM


def tiny_llama(seed: int = 0, tied: bool = True) -> TransformerLM:
    config = TransformerConfig.llama_style(vocab_size=96, d_model=64, n_layers=2, n_heads=4,
                                           n_kv_heads=2, d_ff=96, max_seq_len=48,
                                           rope_interleaved=True, tie_embeddings=tied)
    return TransformerLM(config, generator=gen(seed)).eval()


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


# ---------------------------------------------------------------- Int4Linear


def test_int4_worked_example():
    """One row, one group: s = 0.5, z = 1, codes 0..15 and back: w = (q - 8) 0.5 + 1."""
    codes = torch.tensor([list(range(16)) * 2] * 16, dtype=torch.int32)  # (16, 32)
    layer = Int4Linear(codes, torch.full((16, 1), 0.5), torch.full((16, 1), 1.0))
    w = layer.weight()
    assert torch.equal(w[0, :16], torch.arange(16) * 0.5 - 3.0)
    x = torch.zeros(1, 32)
    x[0, 3] = 2.0  # picks column 3: 2 * (3 * 0.5 - 3) = -3
    assert torch.equal(layer(x), torch.full((1, 16), -3.0))


@settings(max_examples=15, deadline=None)
@given(n_out=st.sampled_from([16, 48, 80]), groups=st.integers(1, 4),
       group=st.sampled_from([32, 64]), seed=st.integers(0, 2**16))
def test_int4_equals_dequantise_then_matmul(n_out, groups, group, seed):
    K = groups * group
    W = randn(n_out, K, seed=seed, dtype=torch.float32)
    layer = Int4Linear.from_float(W, group)
    x = randn(3, 5, K, seed=seed + 1, dtype=torch.float32)
    reference = bf16(x) @ layer.weight().T  # bf16 activations, the kernel's weights
    got = layer(x)
    assert got.shape == (3, 5, n_out) and got.dtype == torch.float32
    assert (got - reference).abs().max() <= 1e-2 * reference.abs().max()
    # each weight within half a step of W, plus the bf16 rounding (relative 2^-8) of the
    # scale s (times |q - 8| <= 8) and of the zero z = min + 8 s
    g = W.view(n_out, groups, group)
    step = (g.amax(-1) - g.amin(-1)) / 15
    zero = g.amin(-1) + 8 * step
    err = (layer.weight() - W).view(n_out, groups, group).abs().amax(-1)
    assert torch.all(err <= step / 2 + 2**-8 * (8 * step + zero.abs()) + 1e-6)


def test_int4_from_q4_1_runs_the_files_codes():
    f = read_gguf(smollm2_path())
    t = f.tensors["blk.0.attn_k.weight"]  # (192, 576) Q4_1
    layer = Int4Linear.from_q4_1(t.data, t.shape)
    exact = torch.from_numpy(dequantize(t.data, t.qtype, t.shape))  # d q + m in float32
    blocks = np.ascontiguousarray(t.data).reshape(192, 18, 20)
    d = torch.from_numpy(blocks[..., :2].copy().view("<f2")[..., 0].astype(np.float32))
    m = torch.from_numpy(blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float32))
    q = (exact - m.repeat_interleave(32, 1)) / d.repeat_interleave(32, 1)
    expected = (q.round() - 8) * bf16(d).repeat_interleave(32, 1) + \
        bf16(m + 8 * d).repeat_interleave(32, 1)
    assert torch.allclose(layer.weight(), expected, rtol=0, atol=1e-6)
    # the bf16 rounding of d and m is the only change (bf16 keeps 8 significant bits)
    rel = ((layer.weight() - exact).abs().max() / exact.abs().max()).item()
    assert 0 < rel < 2e-2


def test_int4_errors():
    with pytest.raises(ValueError, match="group_size"):
        Int4Linear.from_float(torch.randn(16, 48), 32)
    with pytest.raises(ValueError, match="multiple of 16"):
        Int4Linear(torch.zeros(10, 32, dtype=torch.int32), torch.ones(10, 1), torch.ones(10, 1))
    with pytest.raises(ValueError, match="0..15"):
        Int4Linear(torch.full((16, 32), 16, dtype=torch.int32), torch.ones(16, 1), torch.ones(16, 1))
    with pytest.raises(ValueError, match="non-finite"):
        Int4Linear.from_float(torch.full((16, 32), float("nan")))
    layer = Int4Linear.from_float(torch.randn(16, 32))
    with pytest.raises(ValueError, match=r"\(\.\.\., 32\)"):
        layer(torch.randn(2, 31))


# ---------------------------------------------------------------- Int8Linear


def test_int8_equals_dequantise_then_matmul():
    W = randn(80, 96, seed=3, dtype=torch.float32)
    layer = Int8Linear(W)
    s = W.abs().amax(1) / 127
    assert torch.equal(layer.codes, torch.round(W / s[:, None]).to(torch.int8))
    x = randn(4, 96, seed=4, dtype=torch.float32)
    reference = bf16(x) @ layer.weight().T
    assert (layer(x) - reference).abs().max() <= 1e-2 * reference.abs().max()
    assert layer.storage_bytes() == 80 * 96 + 2 * 80


# ---------------------------------------------------------------- the static cache and the step


def test_decode_step_equals_the_models_forward_with_chapter_12s_cache():
    model = tiny_llama()
    ids = torch.randint(0, 96, (2, 9), generator=gen(1))
    with torch.no_grad():
        reference = model(ids)
        static = StaticKVCache.for_model(model, 2, 20)
        got = decode_step(model, ids[:, :6], torch.tensor(0), static)
        for t in range(6, 9):  # then one token at a time
            got = torch.cat([got, decode_step(model, ids[:, t:t + 1], torch.tensor(t), static)], 1)
        dynamic = KVCache.for_model(model, 2, 20)
        model(ids, cache=dynamic)
    assert (got - reference).abs().max() < 1e-5
    for layer in range(2):
        assert torch.allclose(static.keys[layer][:, :, :9], dynamic.keys[layer][:, :, :9], atol=1e-6)
    assert static.num_bytes() == 2 * 2 * 2 * 2 * 20 * 16 * 4


def test_quantised_model_decodes_close_to_the_float_one():
    model = tiny_llama(5)
    ids = torch.randint(0, 96, (1, 12), generator=gen(2))
    with torch.no_grad():
        reference = model(ids)
        quantize_for_decode(model, head="int8")
        cache = StaticKVCache.for_model(model, 1, 12)
        got = decode_step(model, ids, torch.tensor(0), cache)
    assert isinstance(model.blocks[0].attn.q_proj, Int4Linear)
    assert isinstance(model.lm_head, Int8Linear)
    assert (got - reference).abs().max() < 0.1 * reference.abs().max()


def test_compiled_step_equals_the_eager_step():
    model = tiny_llama(7, tied=False)
    quantize_for_decode(model, head="int4")
    ids = torch.randint(0, 96, (1, 5), generator=gen(3))
    follow = torch.randint(0, 96, (1, 4), generator=gen(4))
    step = compiled_decode_step(model)
    with torch.no_grad():
        eager, compiled = StaticKVCache.for_model(model, 1, 9), StaticKVCache.for_model(model, 1, 9)
        a = [decode_step(model, ids, torch.tensor(0), eager)]
        b = [step(ids, torch.tensor(0), compiled)]
        for i in range(4):
            a.append(decode_step(model, follow[:, i:i + 1], torch.tensor(5 + i), eager))
            b.append(step(follow[:, i:i + 1], torch.tensor(5 + i), compiled))
    assert torch.equal(torch.cat(a, 1), torch.cat(b, 1))
    pairs = zip(eager.keys + eager.values, compiled.keys + compiled.values, strict=True)
    assert all(torch.equal(x, y) for x, y in pairs)


def test_static_cache_errors():
    model = tiny_llama()
    with pytest.raises(ValueError, match="exceeds"):
        StaticKVCache.for_model(model, 1, 49)
    with pytest.raises(ValueError, match="batch_size"):
        StaticKVCache.for_model(model, 0, 8)


def test_quantize_for_decode_errors():
    with pytest.raises(TypeError, match="TransformerLM"):
        quantize_for_decode(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="head"):
        quantize_for_decode(tiny_llama(), head="int2")
    gpt2 = TransformerLM(TransformerConfig.gpt2_style(vocab_size=32, d_model=32, n_layers=1,
                                                      n_heads=2, max_seq_len=8))
    with pytest.raises(ValueError, match="Llama-style"):
        quantize_for_decode(gpt2)


# ---------------------------------------------------------------- measuring


def test_bytes_per_token_counts_every_weight_once():
    model = tiny_llama(tied=True)
    c = model.config
    got = decode_bytes_per_token(model, 10)
    per_block = 4 * (2 * 64 + 64 * (64 + 2 * 32 + 64) + 3 * 64 * 96)
    assert got["weights"] == 2 * per_block + 4 * 64 + 4 * 96 * 64
    assert got["kv_cache"] == 2 * c.n_layers * 10 * c.n_kv_heads * c.d_head * 4
    assert got["total"] == got["weights"] + got["kv_cache"]
    quantize_for_decode(model, head="int8")
    q = decode_bytes_per_token(model, 10)
    int4 = lambda n, k: n * k // 2 + 4 * n * k // 32  # noqa: E731
    per_block = 4 * 2 * 64 + int4(64, 64) * 2 + int4(32, 64) * 2 + 2 * int4(96, 64) + int4(64, 96)
    assert q["weights"] == 2 * per_block + 4 * 64 + (96 * 64 + 2 * 96) + 4 * 64  # + one row


def test_bandwidth_and_profile_are_measurements():
    assert stream_bandwidth(1 << 20, 2) > 1e8  # any machine copies more than 100 MB/s
    model = tiny_llama()
    cache = StaticKVCache.for_model(model, 1, 8)
    with torch.no_grad():
        groups = profile_decode_step(
            lambda: decode_step(model, torch.tensor([[1]]), torch.tensor(0), cache), repeats=3)
    parts = sum(v for k, v in groups.items() if k != "wall")
    assert groups["matmul (linear layers)"] > 0 and abs(parts - groups["wall"]) < 0.5 * groups["wall"]
    with pytest.raises(ValueError, match="n_bytes must be positive"):
        stream_bandwidth(0)


# ---------------------------------------------------------------- the one generate, three caches


@pytest.mark.parametrize("style", ["llama", "gpt2"])
def test_generate_with_each_cache_gives_the_same_tokens(style):
    if style == "llama":
        model = tiny_llama(11).double()
    else:
        model = TransformerLM(TransformerConfig.gpt2_style(
            vocab_size=96, d_model=48, n_layers=2, n_heads=3, max_seq_len=40),
            generator=gen(12)).double().eval()
    prompt = torch.randint(0, 96, (2, 6), generator=gen(5))
    runs = {kind: generate(model, prompt, 10, temperature=1.0, generator=gen(9), kv_cache=kind)
            for kind in ("dynamic", "static")}
    runs["recompute"] = generate(model, prompt, 10, temperature=1.0, generator=gen(9),
                                 use_cache=False)
    assert torch.equal(runs["dynamic"], runs["static"])
    assert torch.equal(runs["dynamic"], runs["recompute"])


def test_generate_with_the_compiled_step_equals_eager():
    model = tiny_llama(13)
    quantize_for_decode(model, head="int8")
    prompt = torch.randint(0, 96, (1, 7), generator=gen(6))
    eager = generate(model, prompt, 6, temperature=0, kv_cache="static")
    compiled = generate(model, prompt, 6, temperature=0, kv_cache="compiled")
    assert torch.equal(eager, compiled)
    assert compiled_decode_step(model) is compiled_decode_step(model)  # compiled once
    with pytest.raises(ValueError, match="kv_cache"):
        generate(model, prompt, 2, kv_cache="paged")


def test_quantize_for_decode_keeps_the_files_own_q4_1_codes(monkeypatch):
    from llmbook.inference.gguf import load_model

    path = smollm2_path()
    source = read_gguf(path)
    model, _ = load_model(path)
    rounded_again, _ = load_model(path)
    read_from_file = []
    original = Int4Linear.from_q4_1.__func__

    def spy(cls, data, shape):
        read_from_file.append(tuple(shape))
        return original(cls, data, shape)

    monkeypatch.setattr(Int4Linear, "from_q4_1", classmethod(spy))
    quantize_for_decode(model, source, head="int8")
    assert len(read_from_file) == 210  # every projection from the file's bytes
    monkeypatch.undo()
    quantize_for_decode(rounded_again, None, head="int8")  # min-max rounding of the float weights
    for layer, path_in_block, name in ((0, "attn.q_proj", "attn_q"), (29, "mlp.down_proj", "ffn_down"),
                                       (7, "attn.v_proj", "attn_v")):
        t = source.tensors[f"blk.{layer}.{name}.weight"]
        from_file = Int4Linear.from_q4_1(t.data, t.shape)
        for m in (model, rounded_again):  # Q4_1's grid is min-max: rounding it again is exact
            got = m.blocks[layer].get_submodule(path_in_block)
            assert torch.equal(got.packed, from_file.packed), (layer, name)
            assert torch.equal(got.scales_and_zeros, from_file.scales_and_zeros), (layer, name)
