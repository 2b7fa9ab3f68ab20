"""Checks of the build-it-yourself unit of Part II (``build2_transformer``), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the reader's functions as ``solutions.name(...)``.
The peers are PyTorch's ``torch.softmax``, ``scaled_dot_product_attention`` and
``torch.nn.RMSNorm``; ``transformers``' Llama (``apply_rotary_pos_emb`` with
``LlamaRotaryEmbedding``, ``LlamaRMSNorm``, ``LlamaMLP`` and ``LlamaForCausalLM``, built
from small random configurations, imported inside the checks that use them); and the
book's own modules (``llmbook.transformer``). Comparisons run in float64 on non-square
shapes wherever the peer allows, with tolerances fixed in advance and stated in each
message. The last check runs SmolLM2-135M (the GGUF file the book reads in
:mod:`llmbook.inference.gguf`) with the reader's block in every layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

#: The unit's exercises, ``{number: (stars, title)}``, in build order.
EXERCISES = {
    1: (1, "Stable softmax along any axis"),
    2: (2, "Scaled dot-product attention with a boolean or causal mask"),
    3: (2, "The rotary position embedding in the half-split pairing"),
    4: (1, "RMSNorm"),
    5: (1, "The SwiGLU feed-forward layer"),
    6: (3, "A Llama decoder block with grouped-query attention"),
    7: (2, "End to end: your block, norm and softmax run SmolLM2"),
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Modules built inside draw their initial weights from ``seed``; the global generator is
    left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _largest(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference, inf when a value is not finite or the shapes differ."""
    if not isinstance(a, torch.Tensor) or a.shape != b.shape:
        return math.inf
    return float((a.double() - b.double()).abs().max())


def _shape_and_dtype(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert isinstance(got, torch.Tensor) and got.shape == want.shape, (
        f"expected {name} to return a tensor of shape {tuple(want.shape)}, got "
        f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
    assert got.dtype == want.dtype, f"expected {name} to return {want.dtype}, got {got.dtype}"


def exercise_1_softmax(solutions) -> None:
    x = torch.randn(3, 5, 7, generator=_gen(0), dtype=torch.float64) * 3.0
    for dim in (0, 1, 2, -1, -2):
        got, want = solutions.softmax(x, dim), torch.softmax(x, dim=dim)
        _shape_and_dtype(f"softmax(x, dim={dim})", got, want)
        err = _largest(got, want)
        assert err <= 1e-14, (
            f"expected softmax(x, dim={dim}) on a (3, 5, 7) float64 tensor to equal torch.softmax "
            f"to 1e-14, largest difference {err:.3g}")
    default = solutions.softmax(x)
    assert _largest(default, torch.softmax(x, dim=-1)) <= 1e-14, (
        "expected softmax(x) with the default dim to normalise the last axis")
    # large logits: without the shift by the max, exp overflows to inf and the ratio is NaN
    big = torch.randn(4, 9, generator=_gen(1)) * 1e4
    got = solutions.softmax(big, -1)
    assert bool(torch.isfinite(got).all()), (
        f"expected finite probabilities for float32 logits of size 1e4, got "
        f"{int((~torch.isfinite(got)).sum())} entries that are inf or NaN: subtract each row's "
        "largest logit before exp")
    err = _largest(got, torch.softmax(big, dim=-1))
    assert err <= 1e-6, (
        f"expected softmax of float32 logits of size 1e4 to equal torch.softmax to 1e-6, "
        f"largest difference {err:.3g}")
    # -inf removes an entry (the row keeps a finite one)
    masked = x[0].clone()
    masked[:, 1] = float("-inf")
    masked[2, 4:] = float("-inf")
    got = solutions.softmax(masked, -1)
    zeros = got[:, 1].abs().max().item() if isinstance(got, torch.Tensor) else math.nan
    assert zeros == 0.0, f"expected probability 0 where the logit is -inf, got up to {zeros!r}"
    err = _largest(got, torch.softmax(masked, dim=-1))
    assert err <= 1e-14, (
        f"expected softmax of logits with -inf entries to equal torch.softmax to 1e-14, "
        f"largest difference {err:.3g}")


def exercise_2_attention(solutions) -> None:
    from llmbook.transformer.attention import scaled_dot_product_attention as book_attention

    g = _gen(2)
    B, H, T_q, T_k, d_k, d_v = 2, 3, 5, 7, 8, 6  # nothing square
    q = torch.randn(B, H, T_q, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, T_k, d_k, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, T_k, d_v, generator=g, dtype=torch.float64)
    random_mask = torch.rand(B, 1, T_q, T_k, generator=g) < 0.6
    random_mask[..., 0] = True  # every query keeps a key: PyTorch's kernel has no rule for none
    cases = [("no mask", {}, {}),
             ("is_causal=True (T_q = 5, T_k = 7, aligned top left)", {"is_causal": True}, {"is_causal": True}),
             ("a random boolean mask of shape (2, 1, 5, 7)", {"mask": random_mask}, {"attn_mask": random_mask})]
    for what, ours, theirs in cases:
        got = solutions.attention(q, k, v, **ours)
        want = F.scaled_dot_product_attention(q, k, v, **theirs)
        _shape_and_dtype(f"attention with {what}", got, want)
        err = _largest(got, want)
        assert err <= 1e-12, (
            f"expected attention with {what} to equal torch's scaled_dot_product_attention in "
            f"float64 to 1e-12, largest difference {err:.3g}")
        book = book_attention(q, k, v, mask=ours.get("mask"), is_causal=ours.get("is_causal", False))
        err = _largest(got, book)
        assert err <= 1e-12, (
            f"expected attention with {what} to equal the book's scaled_dot_product_attention "
            f"to 1e-12, largest difference {err:.3g}")
    # a query whose every key is masked outputs zeros, not NaN
    dead = random_mask.clone()
    dead[1, 0, 3] = False
    got = solutions.attention(q, k, v, mask=dead)
    row = got[1, :, 3]
    assert bool(torch.isfinite(got).all()) and float(row.abs().max()) == 0.0, (
        f"expected zeros (and no NaN) for query 3 of batch entry 1, whose keys are all masked, "
        f"got values up to {float(row.abs().max())!r} and {int(torch.isnan(got).sum())} NaN entries")
    err = _largest(got, book_attention(q, k, v, mask=dead))
    assert err <= 1e-12, (
        f"expected attention with a fully masked query row to equal the book's to 1e-12 elsewhere, "
        f"largest difference {err:.3g}")


def exercise_3_rope(solutions) -> None:
    from llmbook.transformer.positional import RotaryEmbedding

    g = _gen(3)
    B, H, T, d, theta = 2, 3, 7, 12, 500.0
    positions = torch.tensor([3, 4, 9, 10, 11, 30, 63])  # not 0..T-1
    x = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    got = solutions.apply_rope(x, positions, theta)
    want = RotaryEmbedding(d, theta=theta, max_seq_len=64, dtype=torch.float64)(x, positions)
    _shape_and_dtype("apply_rope", got, want)
    err = _largest(got, want)
    assert err <= 1e-12, (
        f"expected apply_rope (half-split pairs (j, j + d/2), theta = {theta}) to equal the book's "
        f"RotaryEmbedding in float64 to 1e-12, largest difference {err:.3g}")
    default = solutions.apply_rope(x, positions)
    want = RotaryEmbedding(d, max_seq_len=64, dtype=torch.float64)(x, positions)
    err = _largest(default, want)
    assert err <= 1e-12, (
        f"expected apply_rope with the default theta = 10000 to equal the book's to 1e-12, "
        f"largest difference {err:.3g}")
    # the peer: transformers' Llama, in float32 (its tables are computed in float32)
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=H * d, num_attention_heads=H, head_dim=d, max_position_embeddings=64,
                      rope_theta=theta)
    q32, k32 = x.float(), torch.randn(B, H, T, d, generator=g)
    cos, sin = LlamaRotaryEmbedding(cfg)(q32, positions.expand(B, T))
    q_hf, k_hf = apply_rotary_pos_emb(q32, k32, cos, sin)
    for name, ours, theirs in (("queries", solutions.apply_rope(q32, positions, theta), q_hf),
                               ("keys", solutions.apply_rope(k32, positions, theta), k_hf)):
        _shape_and_dtype(f"apply_rope on float32 {name}", ours, theirs)
        err = _largest(ours, theirs)
        assert err <= 1e-4, (
            f"expected apply_rope on float32 {name} to equal transformers' apply_rotary_pos_emb "
            f"(Llama) to 1e-4, largest difference {err:.3g}")
    # the property RoPE exists for: the score depends on the positions only through n - m
    q = torch.randn(d, generator=g, dtype=torch.float64)
    k = torch.randn(d, generator=g, dtype=torch.float64)
    both = torch.stack([q, k])[:, None, :]  # (2, 1, d): T = 1 each

    def score(m: int, n: int) -> float:
        rq = solutions.apply_rope(both[:1], torch.tensor([m]), theta)
        rk = solutions.apply_rope(both[1:], torch.tensor([n]), theta)
        return float((rq * rk).sum())

    s0, s1 = score(2, 9), score(30, 37)
    assert abs(s0 - s1) <= 1e-12 * max(1.0, abs(s0)), (
        f"expected the score of a query at m and a key at n to depend only on n - m (to 1e-12): "
        f"(m, n) = (2, 9) gave {s0!r} and (30, 37) gave {s1!r}")


def exercise_4_rms_norm(solutions) -> None:
    g = _gen(4)
    d = 12
    x = torch.randn(2, 5, d, generator=g, dtype=torch.float64) * 2.0 + 1.0  # a mean away from 0
    w = 1.0 + 0.3 * torch.randn(d, generator=g, dtype=torch.float64)
    for eps in (1e-6, 0.5):  # 0.5: an eps big enough to matter
        ref = torch.nn.RMSNorm(d, eps=eps, dtype=torch.float64)
        with torch.no_grad():
            ref.weight.copy_(w)
            want = ref(x)
        got = solutions.rms_norm(x, w, eps)
        _shape_and_dtype(f"rms_norm(x, weight, eps={eps})", got, want)
        err = _largest(got, want)
        assert err <= 1e-12, (
            f"expected rms_norm with eps = {eps} to equal torch.nn.RMSNorm in float64 to 1e-12, "
            f"largest difference {err:.3g}")
    got = solutions.rms_norm(x, w)
    with torch.no_grad():
        want = F.rms_norm(x, (d,), w, 1e-6)
    assert _largest(got, want) <= 1e-12, "expected rms_norm's default eps to be 1e-6"
    # the peer: transformers' Llama, in float32 and in bfloat16 (normalised in float32)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, None)):
        llama = LlamaRMSNorm(d, eps=1e-6).to(dtype)
        with torch.no_grad():
            llama.weight.copy_(w)
            xs = x.to(dtype)
            want = llama(xs)
        got = solutions.rms_norm(xs, llama.weight.detach(), 1e-6)
        _shape_and_dtype(f"rms_norm on {dtype} input", got, want)
        err = _largest(got, want)
        if tol is None:  # one bfloat16 rounding: 2^-7 relative
            tol_text, ok = "one bfloat16 step (2^-7 relative)", bool(
                ((got.double() - want.double()).abs() <= 2.0 ** -7 * want.double().abs()).all())
        else:
            tol_text, ok = f"{tol:g}", err <= tol
        assert ok, (
            f"expected rms_norm on {dtype} input to equal transformers' LlamaRMSNorm to {tol_text}, "
            f"largest difference {err:.3g}" + (" (normalise in float32, cast back, then scale)"
                                               if tol is None else ""))


def exercise_5_swiglu(solutions) -> None:
    d, d_ff = 12, 20
    g = _gen(5)
    w_gate, w_up = (0.3 * torch.randn(d_ff, d, generator=g, dtype=torch.float64) for _ in range(2))
    w_down = 0.3 * torch.randn(d, d_ff, generator=g, dtype=torch.float64)
    x = torch.randn(2, 7, d, generator=_gen(6), dtype=torch.float64)
    got = solutions.swiglu(x, w_gate, w_up, w_down)
    # the peer: transformers' LlamaMLP holding the same weights
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    with _seeded(5):
        mlp = LlamaMLP(LlamaConfig(hidden_size=d, intermediate_size=d_ff, hidden_act="silu",
                                   num_attention_heads=2)).double()
    with torch.no_grad():
        for linear, w in ((mlp.gate_proj, w_gate), (mlp.up_proj, w_up), (mlp.down_proj, w_down)):
            linear.weight.copy_(w)
        want = mlp(x)
    _shape_and_dtype("swiglu", got, want)
    err = _largest(got, want)
    assert err <= 1e-12, (
        f"expected swiglu to equal transformers' LlamaMLP with the same weights (d = {d}, "
        f"d_ff = {d_ff}) in float64 to 1e-12, largest difference {err:.3g} "
        f"(the output is of size {float(want.abs().max()):.3g})")


def _block_weights(block: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The book's DecoderBlock's tensors under the names of ``transformer_block``'s ``weights``."""
    return {name.removesuffix(".weight").split(".")[-1]: p.detach() for name, p in block.named_parameters()}


def exercise_6_transformer_block(solutions) -> None:
    from llmbook.transformer.hf_loading import from_hf, randomize_parameters_
    from llmbook.transformer.model import DecoderBlock, TransformerConfig
    from llmbook.transformer.positional import RotaryEmbedding

    H, H_kv, d, d_head, theta, eps = 4, 2, 48, 16, 500.0, 1e-3  # d_head != d / H; GQA groups of 2
    config = TransformerConfig.llama_style(vocab_size=2, d_model=d, n_layers=2, n_heads=H, n_kv_heads=H_kv,
                                           d_head=d_head, d_ff=80, max_seq_len=32, rope_theta=theta,
                                           norm_eps=eps)
    with _seeded(7):
        blocks = [DecoderBlock(config, layer).double() for layer in range(2)]
    noise = _gen(7)
    with torch.no_grad():
        for block in blocks:
            randomize_parameters_(block, 0.1, noise)  # norm gains away from 1
    x = torch.randn(2, 11, d, generator=_gen(8), dtype=torch.float64)
    positions, rope = torch.arange(11), RotaryEmbedding(d_head, theta=theta, max_seq_len=32, dtype=torch.float64)
    got = solutions.transformer_block(x, _block_weights(blocks[0]), H, H_kv, theta, eps)
    with torch.no_grad():
        want = blocks[0](x, positions, rope)
    _shape_and_dtype("transformer_block", got, want)
    err = _largest(got, want)
    assert err <= 1e-12, (
        f"expected transformer_block (d = {d}, H = {H}, H_kv = {H_kv}, d_head = {d_head}, "
        f"theta = {theta}, eps = {eps}) to equal the book's DecoderBlock with float64 rotary tables "
        f"to 1e-12, largest difference {err:.3g} (the output is of size {float(want.abs().max()):.3g})")
    # a second layer, fed the first's output, with its own weights
    got = solutions.transformer_block(want, _block_weights(blocks[1]), H, H_kv, theta, eps)
    with torch.no_grad():
        want = blocks[1](want, positions, rope)
    err = _largest(got, want)
    assert err <= 1e-12, (
        f"expected transformer_block with the second layer's weights to equal the book's second "
        f"DecoderBlock to 1e-12, largest difference {err:.3g}")
    # the defaults: theta = 10000 and eps = 1e-5, Llama 2's
    default = solutions.transformer_block(x, _block_weights(blocks[0]), H, H_kv)
    with _seeded(7):
        plain = DecoderBlock(TransformerConfig(**{**config.to_dict(), "norm_eps": 1e-5})).double()
    plain.load_state_dict(blocks[0].state_dict())
    with torch.no_grad():
        want = plain(x, positions, RotaryEmbedding(d_head, max_seq_len=32, dtype=torch.float64))
    err = _largest(default, want)
    assert err <= 1e-12, (
        f"expected transformer_block's defaults to be theta = 10000 and eps = 1e-5 (equal to the "
        f"book's block with them to 1e-12), largest difference {err:.3g}")
    # the peer: transformers' LlamaForCausalLM, its first decoder layer's output
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=d, intermediate_size=80, num_hidden_layers=2,
                      num_attention_heads=H, num_key_value_heads=H_kv, head_dim=d_head,
                      max_position_embeddings=32, rope_theta=theta, rms_norm_eps=eps,
                      attn_implementation="eager")
    with _seeded(9):
        hf = LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():
        randomize_parameters_(hf, 0.1, _gen(10))
        hidden = hf(torch.randint(0, 97, (2, 11), generator=_gen(11)), output_hidden_states=True).hidden_states
    with _seeded(9):
        weights = _block_weights(from_hf(hf).blocks[0])
    got = solutions.transformer_block(hidden[0], weights, H, H_kv, theta, eps)
    err = _largest(got, hidden[1])
    assert err <= 1e-5, (
        f"expected transformer_block (H = {H}, H_kv = {H_kv}, d_head = {d_head}, theta = {theta}, "
        f"eps = {eps}) on the embeddings to equal the first layer of transformers' LlamaForCausalLM "
        f"in float64 to 1e-5 (its rotary tables are float32), largest difference {err:.3g} (the "
        f"output is of size {float(hidden[1].abs().max()):.3g})")


def exercise_7_end_to_end_smollm2(solutions) -> None:
    from llmbook.inference.gguf import load_model
    from llmbook.transformer.hf_loading import randomize_parameters_
    from llmbook.transformer.model import DecoderBlock, TransformerConfig
    from llmbook.transformer.positional import RotaryEmbedding, rope_permutation

    # first a small multi-query block (H_kv = 1), in float32, before the real model loads
    small = TransformerConfig.llama_style(vocab_size=2, d_model=24, n_layers=1, n_heads=3, n_kv_heads=1,
                                          d_ff=40, max_seq_len=8)
    with _seeded(9):
        block = DecoderBlock(small)
    with torch.no_grad():
        randomize_parameters_(block, 0.2, _gen(9))
        x = torch.randn(2, 6, 24, generator=_gen(10))
        want = block(x, torch.arange(6), RotaryEmbedding(8, max_seq_len=8))
    got = solutions.transformer_block(x, _block_weights(block), 3, 1)
    _shape_and_dtype("transformer_block on float32 input", got, want)
    err = _largest(got, want)
    assert err <= 1e-5, (
        f"expected transformer_block with one key/value head shared by 3 query heads (multi-query) "
        f"to equal the book's DecoderBlock in float32 to 1e-5, largest difference {err:.3g}")

    model, tok = load_model()  # SmolLM2-135M-Instruct, float32; the book's TransformerLM
    c = model.config
    texts = ["The capital of France is Paris. The capital of Italy is",
             "def add(a, b):\n    return a + b\n\nprint(add(2,"]
    encoded = [tok.encode(t) for t in texts]
    T = min(len(e) for e in encoded)
    ids = torch.tensor([e[-T:] for e in encoded])  # (2, T)
    with torch.no_grad():
        want = model(ids)  # (2, T, V)
    # The GGUF file stores W_q and W_k in the interleaved RoPE layout (c.rope_interleaved):
    # permute their rows, head by head, into the half-split layout of apply_rope.
    back = torch.argsort(rope_permutation(c.d_head))

    def half_split(w: torch.Tensor, heads: int) -> torch.Tensor:
        return w.view(heads, c.d_head, -1)[:, back].reshape(w.shape)

    def reader_block(weights: dict[str, torch.Tensor]):
        def forward(x, *args, **kwargs):
            return solutions.transformer_block(x, weights, c.n_heads, c.n_kv_heads, c.rope_theta, c.norm_eps)
        return forward

    for block in model.blocks:
        weights = _block_weights(block)
        weights["q_proj"] = half_split(weights["q_proj"], c.n_heads)
        weights["k_proj"] = half_split(weights["k_proj"], c.n_kv_heads)
        block.forward = reader_block(weights)
    gain = model.final_norm.weight.detach()
    model.final_norm.forward = lambda x: solutions.rms_norm(x, gain, c.norm_eps)
    with torch.no_grad():
        got = model(ids)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == torch.float32, (
        f"expected float32 logits of shape {tuple(want.shape)} from SmolLM2 with your block, got "
        f"{got.dtype if isinstance(got, torch.Tensor) else type(got).__name__} of shape "
        f"{tuple(got.shape) if isinstance(got, torch.Tensor) else '?'}")
    err = _largest(got, want)
    assert err <= 1e-3, (
        f"expected SmolLM2's logits with your transformer_block in all {c.n_layers} layers and your "
        f"rms_norm as the final norm to equal the book's model to 1e-3 (float32; the logits are of "
        f"size {float(want.abs().max()):.3g}), largest difference {err:.3g}")
    p_got, p_want = solutions.softmax(got, -1), torch.softmax(want, dim=-1)
    err = _largest(p_got, p_want)
    assert err <= 5e-4, (  # logits within 1e-3 move a probability by at most about half that
        f"expected your softmax of those logits to give the book's next-token probabilities to "
        f"5e-4, largest difference {err:.3g}")
    same = got.argmax(-1) == want.argmax(-1)
    assert bool(same.all()), (
        f"expected the same most likely next token at all {same.numel()} positions, they differ at "
        f"{int((~same).sum())}")
    assert tok.decode([int(got[0, -1].argmax())]).strip() == "Rome", (
        f"expected SmolLM2 with your block to continue 'The capital of Italy is' with ' Rome', got "
        f"{tok.decode([int(got[0, -1].argmax())])!r}")
