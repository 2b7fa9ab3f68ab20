"""Tests for llmbook.inference.real_quant: the real model's quantisation sweep.

Small inputs with exact expectations (windows, perplexity against
``torch.nn.functional.cross_entropy``, bits-per-weight accounting, llama.cpp's fallbacks),
the block-at-a-time GPTQ/AWQ driver against ``quantize_model`` on a whole model, and the
shipped sweep (``data/quantisation/smollm2_sweep.json``) against the real file and against
a short slice recomputed here in float64.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import sympy
import torch
import torch.nn.functional as F
from torch import nn

from llmbook.inference.ggml_kquants import q4_k_m_types
from llmbook.inference.ggml_quants import dequantize, quantize
from llmbook.inference.gptq import quantize_model
from llmbook.inference.real_quant import (
    CHECK_TOKENS,
    LINEAR_INPUTS,
    SWEEP_JSON,
    VARIANTS,
    apply_state,
    build_variant,
    format_bits,
    heldout_ids,
    ids_sha256,
    linear_inputs,
    llama_cpp_type,
    perplexity,
    quantize_blockwise,
    requantize_ggml,
    storage_bits,
    window_bounds,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_llama(seed: int = 0) -> TransformerLM:
    """SwiGLU, RoPE and grouped-query attention (4 query heads, 2 key/value heads), d = 64."""
    config = TransformerConfig.llama_style(vocab_size=40, d_model=64, n_layers=2, n_heads=4,
                                           n_kv_heads=2, d_ff=96, max_seq_len=64)
    return TransformerLM(config, generator=torch.Generator().manual_seed(seed)).eval()


class Uniform(nn.Module):
    """A 'model' that gives every token of a V-word vocabulary the same logit."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*ids.shape, self.vocab)


# ---------------------------------------------------------------- windows and perplexity


def test_window_bounds():
    assert window_bounds(1100, 512) == [(0, 512), (512, 1024), (1024, 1100)]
    assert window_bounds(1025, 512) == [(0, 512), (512, 1024)]  # a lone token predicts nothing
    assert window_bounds(512, 512) == [(0, 512)]
    assert window_bounds(5, 100) == [(0, 5)]
    for bad in ((1, 512), (100, 1), (100, True), (100.0, 512)):
        with pytest.raises(ValueError, match="must be an int >= 2"):
            window_bounds(*bad)


def test_perplexity_of_uniform_logits_is_the_vocabulary_size():
    result = perplexity(Uniform(37), torch.arange(50) % 37, window=16)
    assert result.windows == 4 and result.tokens == 50 - 4  # windows 16, 16, 16, 2
    assert math.isclose(result.ppl, 37.0, rel_tol=1e-12)
    assert math.isclose(result.loss, math.log(37), rel_tol=1e-12)


def test_perplexity_equals_cross_entropy_window_by_window():
    model = tiny_llama()
    ids = torch.randint(0, 40, (45,), generator=torch.Generator().manual_seed(3))
    got = perplexity(model, ids, window=20)  # windows [0, 20), [20, 40), [40, 45)
    nll, count = 0.0, 0
    with torch.no_grad():
        for a, b in ((0, 20), (20, 40), (40, 45)):
            logits = model(ids[None, a:b])[0]
            nll += float(F.cross_entropy(logits[:-1], ids[a + 1:b])) * (b - a - 1)
            count += b - a - 1
    assert got.tokens == count == 42
    assert math.isclose(got.nll, nll, rel_tol=1e-5)
    assert math.isclose(got.ppl, math.exp(nll / count), rel_tol=1e-5)
    whole = perplexity(model, ids, window=45)  # one window: the plain cross-entropy
    with torch.no_grad():
        ce = F.cross_entropy(model(ids[None])[0, :-1].double(), ids[1:])
    assert math.isclose(whole.ppl, math.exp(float(ce)), rel_tol=1e-12)


def test_perplexity_bad_input():
    with pytest.raises(ValueError, match="1-D integer tensor"):
        perplexity(Uniform(5), torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="1-D integer tensor"):
        perplexity(Uniform(5), torch.zeros(8))
    with pytest.raises(ValueError, match="n_tokens must be an int >= 2"):
        perplexity(Uniform(5), torch.zeros(1, dtype=torch.long))


# ---------------------------------------------------------------- bits per weight


def test_format_bits():
    assert format_bits("Q4_K") == sympy.Rational(9, 2)
    assert format_bits("Q6_K") == sympy.Rational(105, 16)
    assert format_bits("Q4_1") == 5 and format_bits("Q8_0") == sympy.Rational(17, 2)
    assert format_bits("F32") == 32
    assert format_bits("NF4/64") == sympy.Rational(9, 2)  # 4 + 32/64
    assert format_bits("INT4/32") == sympy.Rational(37, 8)  # 4 + (16 + 4)/32
    assert format_bits("INT3/128") == 3 + sympy.Rational(19, 128)
    for bad in ("Q4_X", "INT9/32", "INT4/0", "NF4", "nf4/64"):
        with pytest.raises(ValueError, match="unknown format"):
            format_bits(bad)
    with pytest.raises(TypeError, match="fmt must be a format name"):
        format_bits(4)


def test_storage_bits():
    sizes = {"w": 64, "norm": 3, "e": 256}
    formats = {"w": "Q4_0", "norm": "F32", "e": "Q4_K"}
    assert storage_bits(formats, sizes) == 64 * 18 // 4 + 3 * 32 + 144 * 8  # 288 + 96 + 1152
    assert storage_bits(formats, sizes, {"w": 7}) == 288 + 96 + 1152 + 7
    with pytest.raises(ValueError, match="same tensors"):
        storage_bits({"w": "Q4_0"}, sizes)
    with pytest.raises(ValueError, match="not whole blocks of Q4_K"):
        storage_bits({"w": "Q4_K"}, {"w": 320})
    with pytest.raises(ValueError, match="not whole blocks of INT4/32"):
        storage_bits({"w": "INT4/32"}, {"w": 48})


def test_llama_cpp_fallbacks():
    assert [llama_cpp_type(q, 576) for q in ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_1")] == \
        ["Q5_0", "Q5_1", "Q8_0", "Q8_0", "Q4_1"]
    assert [llama_cpp_type(q, 1536) for q in ("Q4_K", "Q5_K", "Q6_K")] == ["Q4_K", "Q5_K", "Q6_K"]
    with pytest.raises(ValueError, match="no fallback"):
        llama_cpp_type("Q4_K", 100)  # not even whole blocks of 32
    with pytest.raises(ValueError, match="no fallback"):
        llama_cpp_type("Q4_0", 48)
    with pytest.raises(ValueError, match="row_length"):
        llama_cpp_type("Q4_K", 0)


# ---------------------------------------------------------------- ggml formats


def test_requantize_ggml_in_memory_order():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((4, 576)).astype(np.float32) * 0.05  # 9 blocks of 256, across rows
    got = requantize_ggml(W, "Q4_K")
    flat = W.reshape(9, 256)
    assert np.array_equal(got, dequantize(quantize(flat, "Q4_K"), "Q4_K", flat.shape).reshape(4, 576))
    # block-32 formats: memory order is ggml's own row-by-row layout
    assert np.array_equal(requantize_ggml(W, "Q5_0"),
                          dequantize(quantize(W, "Q5_0"), "Q5_0", W.shape))
    once = requantize_ggml(W, "Q4_1")  # the Q4_1 grid reproduces itself
    assert np.array_equal(requantize_ggml(once, "Q4_1"), once)
    with pytest.raises(ValueError, match="not a whole number of blocks of 256"):
        requantize_ggml(W[:3], "Q4_K")  # 1728 weights
    with pytest.raises(ValueError, match="2-D numpy array"):
        requantize_ggml(W.ravel(), "Q4_0")
    with pytest.raises(ValueError, match="cannot encode"):
        requantize_ggml(W, "IQ4_NL")


# ---------------------------------------------------------------- GPTQ and AWQ block by block


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
def test_quantize_blockwise_equals_quantize_model(method):
    """One block at a time gives the same weights as quantize_model on the whole model."""
    model = tiny_llama()
    ids = torch.randint(0, 40, (3, 16), generator=torch.Generator().manual_seed(1))
    whole = quantize_model(model, method, 4, 32, ids).state_dict()
    blocks = quantize_blockwise(model, method, 4, 32, ids)
    assert set(blocks) == {k for k in whole if k.startswith("blocks.")}
    for k, v in blocks.items():
        torch.testing.assert_close(v, whole[k], rtol=0, atol=1e-6, msg=k)
    changed = {k for k, v in blocks.items() if not torch.equal(v, model.state_dict()[k])}
    assert len([k for k in changed if k.endswith("proj.weight")]) == 14  # 7 per block
    if method == "awq":  # the scales fold into both norms and into up_proj
        assert {"blocks.0.attn_norm.weight", "blocks.0.mlp_norm.weight"} <= changed


def test_quantize_blockwise_bad_input():
    model = tiny_llama()
    with pytest.raises(ValueError, match="method must be"):
        quantize_blockwise(model, "nf4", 4, 32, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        quantize_blockwise(model, "gptq", 4, 32, torch.zeros(4, dtype=torch.long))


# ---------------------------------------------------------------- the real model and the sweep


@pytest.fixture(scope="module")
def real():
    from llmbook.inference.gguf import load_model, read_gguf, smollm2_path

    source = read_gguf(smollm2_path())
    model, tokenizer = load_model()
    return source, model, tokenizer


@pytest.fixture(scope="module")
def sweep():
    return json.loads(SWEEP_JSON.read_text(encoding="utf-8"))


def test_sweep_json_is_complete_and_consistent(sweep, real):
    source = real[0]
    assert [v["name"] for v in sweep["variants"]] == list(VARIANTS)
    entries = {v["name"]: v for v in sweep["variants"]}
    n_params = sum(t.n_elements for t in source.tensors.values())
    assert sweep["model"]["parameters"] == n_params
    file_bits = sum(8 * t.n_bytes for t in source.tensors.values())  # the file's real bytes
    assert math.isclose(entries["file"]["bits_per_weight_model"], file_bits / n_params, rel_tol=1e-12)
    assert entries["file"]["bits_per_weight_projections"] == 5.0
    assert entries["Q4_1"]["perplexity"] == entries["file"]["perplexity"]  # Q4_1 reproduces itself
    for v in sweep["variants"]:
        assert v["predicted_tokens"] == sweep["heldout"]["tokens"] - v["windows"]
        assert math.isclose(v["perplexity"], math.exp(v["nll"] / v["predicted_tokens"]), rel_tol=1e-12)
    assert entries["Q4_K*"]["storable_by_ggml"] is False and entries["Q4_K_M"]["storable_by_ggml"]
    assert entries["Q4_K*"]["bits_per_weight_projections"] == 4.5


def test_q4_k_m_variant_is_llama_cpps_mixture(real):
    source, model, _ = real
    _, storage = build_variant("Q4_K_M", source, model)
    shapes = {n: t.shape for n, t in source.tensors.items()}
    assert storage["formats"] == q4_k_m_types(list(source.tensors), 30, shapes)
    assert storage["formats"]["token_embd.weight"] == "Q8_0" and storage["storable"] is True


def test_short_slice_recomputed_in_float64(sweep, real):
    """The file and Q4_0 on the first 256 held-out tokens, as the sweep recorded them."""
    source, model, tokenizer = real
    ids = heldout_ids(tokenizer)
    assert len(ids) == sweep["heldout"]["tokens"] and ids_sha256(ids) == sweep["heldout"]["ids_sha256"]
    for name in ("file", "Q4_0"):
        state, _ = build_variant(name, source, model)
        m64 = copy.deepcopy(model)
        apply_state(m64, state)
        got = perplexity(m64.double(), ids[:CHECK_TOKENS], CHECK_TOKENS).ppl
        assert math.isclose(got, sweep["check"][name], rel_tol=1e-9), name


def test_build_variant_bad_input(real):
    source, model, _ = real
    with pytest.raises(ValueError, match="unknown variant"):
        build_variant("Q3_K", source, model)
    with pytest.raises(ValueError, match="needs calib_ids"):
        build_variant("GPTQ", source, model)


def test_linear_inputs_are_what_each_layer_receives():
    """One forward pass with hooks = gptq's capture of one layer at a time."""
    from llmbook.inference.gptq import _capture_inputs

    model = tiny_llama(4)
    ids = torch.randint(0, 40, (11,), generator=torch.Generator().manual_seed(5))
    got = linear_inputs(model, ids)
    assert {k: tuple(v.shape) for k, v in got.items()} == {
        "attention input": (2, 11, 64), "o_proj input": (2, 11, 64), "MLP input": (2, 11, 64),
        "down_proj input": (2, 11, 96)}
    for kind, path in LINEAR_INPUTS.items():
        for layer, block in enumerate(model.blocks):
            expected = _capture_inputs(model, block.get_submodule(path), ids[None])  # (T, d_in)
            assert torch.equal(got[kind][layer], expected), (kind, layer)
    assert not any(m._forward_pre_hooks for m in model.modules())  # the hooks are gone
    with pytest.raises(ValueError, match="1-D integer tensor"):
        linear_inputs(model, ids[None])
