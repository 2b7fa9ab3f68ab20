"""Quantising a real model: SmolLM2-135M-Instruct's perplexity against its bits per weight.

Introduced in notebooks/15_quantisation. The book's real model (:mod:`.gguf`) is a GGUF file
whose 210 projection matrices (q, k, v, o, gate, up, down in 30 layers) are stored in
ggml's Q4_1 format, 5 bits per weight; its token embedding, which is also the output layer
(tied), in Q8_0; its 61 norm gains in F32. The full-precision original is not shipped, so
**every variant here starts from the file's dequantised weights**: a variant's perplexity
measures the extra damage of re-quantising a 4-bit model, and the file is the reference.

A variant stores the 210 projections in another format; the embedding keeps the file's
Q8_0 bytes (as every llama.cpp file type keeps the output matrix at Q6_K or Q8_0) unless
the variant says otherwise, and the norms stay F32. The formats:

* ggml's block formats, encoded by :func:`~.ggml_quants.quantize` (:func:`requantize_ggml`).
  The K formats pack super-blocks of 256 weights, but most of this model's rows are 576
  wide: those tensors are encoded here in blocks of 256 *consecutive weights in memory
  order* (a block may span two rows), a valid numerical experiment of the format's
  arithmetic that ggml itself cannot store. What llama.cpp actually stores instead is the
  fallback type of :func:`llama_cpp_type`; the sweep reports both, labelled;
* llama.cpp's Q4_K_M mixture of per-tensor types (:func:`~.ggml_kquants.q4_k_m_types`);
* the book's NF4 (:func:`~.quant.quantize_nf4`), and its zero-point round-to-nearest,
  GPTQ and AWQ (:func:`~.gptq.quantize_model`), run one decoder block at a time by
  :func:`quantize_blockwise`, calibrated on the standard library's docstrings, never on
  the held-out text.

:func:`perplexity` scores a model on the held-out prose (``data/heldout_prose.txt``, the
book's own text, written after the model was trained) in windows; :func:`format_bits` and
:func:`storage_bits` count the bits each variant stores. ``python -m
llmbook.inference.real_quant`` runs the sweep and writes :data:`SWEEP_JSON`.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import math
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sympy
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.inference.ggml_kquants import q4_k_m_types
from llmbook.inference.ggml_quants import (
    QUANTIZE_TYPES,
    bits_per_weight_symbolic,
    dequantize,
    quantize,
)
from llmbook.inference.gguf_file import GGUFFile, block_layout
from llmbook.inference.gptq import quantize_model, quantize_rtn
from llmbook.inference.quant import quantize_nf4
from llmbook.paths import data_path

__all__ = [
    "HELDOUT_PROSE",
    "SWEEP_JSON",
    "VARIANTS",
    "Perplexity",
    "apply_state",
    "build_variant",
    "calibration_ids",
    "format_bits",
    "heldout_ids",
    "ids_sha256",
    "LINEAR_INPUTS",
    "linear_inputs",
    "llama_cpp_type",
    "perplexity",
    "quantize_blockwise",
    "requantize_ggml",
    "run_sweep",
    "storage_bits",
    "window_bounds",
]

HELDOUT_PROSE = data_path("heldout_prose.txt")
SWEEP_JSON = data_path("quantisation", "smollm2_sweep.json")
WINDOW = 512  # tokens per perplexity window (stride = window)
CALIB_SHAPE = (4, 512)  # calibration windows x tokens, from the standard library's docs
GROUP = 32  # RTN/GPTQ/AWQ groups: 128, common for larger models, does not divide 576
CHECK_TOKENS = 256  # the short slice the notebook and the tests recompute in float64


# ---------------------------------------------------------------- perplexity


def window_bounds(n_tokens: int, window: int) -> list[tuple[int, int]]:
    """Non-overlapping windows [start, stop) over n_tokens tokens with stride = ``window``.

    The last window is shorter when ``window`` does not divide ``n_tokens``; it is dropped
    if it holds a single token (a window of T tokens predicts T - 1 of them: the first has
    no context). E.g. (1100, 512) -> [(0, 512), (512, 1024), (1024, 1100)].
    """
    for name, v in (("n_tokens", n_tokens), ("window", window)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise ValueError(f"{name} must be an int >= 2, got {v!r}")
    return [(a, min(a + window, n_tokens)) for a in range(0, n_tokens, window)
            if min(a + window, n_tokens) - a >= 2]


@dataclass(frozen=True)
class Perplexity:
    """A model's score on a text: total negative log-likelihood ``nll`` (nats) of the
    ``tokens`` it predicted, in ``windows`` windows; ``loss`` = nll / tokens (nats per
    token) and ``ppl`` = exp(loss)."""

    nll: float
    tokens: int
    windows: int

    @property
    def loss(self) -> float:
        return self.nll / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.loss)


@torch.no_grad()
def perplexity(model: nn.Module, ids: Tensor, window: int = WINDOW) -> Perplexity:
    """Perplexity of ``model`` (ids (1, T) -> logits (1, T, V)) on the token ids ``ids`` (n,).

    The text is cut into the windows of :func:`window_bounds`; in each, every token after
    the first is predicted from the ones before it in the window, and the negative
    log-probabilities are summed in float64 (the model runs in its own dtype):
    ppl = exp(Σ -log p(x_t | window so far) / number of predicted tokens).
    """
    if not isinstance(ids, Tensor) or ids.ndim != 1 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids must be a 1-D integer tensor of token ids, got "
                         f"{(tuple(ids.shape), ids.dtype) if isinstance(ids, Tensor) else ids!r}")
    nll, tokens, bounds = 0.0, 0, window_bounds(len(ids), window)
    for a, b in bounds:
        logits = model(ids[None, a:b].long())[0]  # (T, V)
        nll += float(F.cross_entropy(logits[:-1].double(), ids[a + 1:b].long(), reduction="sum"))
        tokens += b - a - 1
    return Perplexity(nll, tokens, len(bounds))


def heldout_ids(tokenizer: Any, path: Path = HELDOUT_PROSE) -> Tensor:
    """The held-out prose encoded by ``tokenizer.encode(text)`` (no special tokens): (n,) int64."""
    return torch.tensor(tokenizer.encode(path.read_text(encoding="utf-8")), dtype=torch.long)


def calibration_ids(tokenizer: Any, shape: tuple[int, int] = CALIB_SHAPE) -> Tensor:
    """GPTQ's and AWQ's calibration batch (B, T): the first B T tokens of the standard
    library's docstrings (``data/stdlib_docs.txt``), a text other than the held-out prose."""
    from llmbook.text.corpus import load_stdlib_docs

    B, T = shape
    ids = tokenizer.encode(load_stdlib_docs(max_bytes=8 * B * T))  # ~4 bytes per token
    if len(ids) < B * T:
        raise ValueError(f"the calibration text gave {len(ids)} tokens, fewer than {B} x {T}")
    return torch.tensor(ids[:B * T], dtype=torch.long).reshape(B, T)


# ---------------------------------------------------------------- bits per weight


def _parse_format(fmt: object) -> tuple[sympy.Rational, int]:
    """(bits per weight, weights per block or group) of a storage format name."""
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name such as 'Q4_K' or 'INT4/32', got {fmt!r}")
    ggml = bits_per_weight_symbolic()
    if fmt in ggml:
        return ggml[fmt], block_layout(fmt)[0]
    m = re.fullmatch(r"(NF4|INT([2-8]))/([1-9][0-9]*)", fmt)
    if m is None:
        raise ValueError(f"unknown format {fmt!r}: a ggml type ({', '.join(ggml)}), "
                         f"'NF4/g' or 'INTb/g' (b in 2..8)")
    g = int(m.group(3))
    if m.group(1) == "NF4":
        return sympy.Integer(4) + sympy.Rational(32, g), g
    b = int(m.group(2))
    return sympy.Integer(b) + sympy.Rational(16 + b, g), g


def format_bits(fmt: str) -> sympy.Rational:
    """Stored bits per weight of a storage format, exactly.

    ggml types (``"Q4_K"``, ``"Q8_0"``, ``"F32"``, ...) from their block fields
    (:func:`~.ggml_quants.bits_per_weight_symbolic`); ``"NF4/g"``: 4-bit codes and one
    float32 absmax per group of g (bitsandbytes' layout without double quantisation),
    4 + 32/g; ``"INTb/g"``: the book's zero-point codes, b bits plus an fp16 scale and a
    b-bit zero per group of g, b + (16 + b)/g (:func:`~.quant.stored_bits_per_weight`).
    """
    return _parse_format(fmt)[0]


def storage_bits(formats: Mapping[str, str], sizes: Mapping[str, int],
                 extra_bits: Mapping[str, int] | None = None) -> int:
    """Total bits to store tensors ``sizes`` (name -> number of weights) in ``formats``
    (name -> :func:`format_bits` name), plus ``extra_bits`` (name -> bits of side data such
    as AWQ's unfolded input scales). Every tensor needs a format; a tensor that is not a
    whole number of its format's blocks (or groups) is a ``ValueError``."""
    if set(formats) != set(sizes):
        raise ValueError(f"formats and sizes must name the same tensors; only in one: "
                         f"{sorted(set(formats) ^ set(sizes))[:3]}")
    total = sympy.Integer(0)
    for name, n in sizes.items():
        bits, block = _parse_format(formats[name])
        if n % block:
            raise ValueError(f"{name}: {n} weights are not whole blocks of {formats[name]} "
                             f"({block} weights each)")
        total += bits * n
    return int(total) + sum((extra_bits or {}).values())


# ---------------------------------------------------------------- ggml formats


#: llama.cpp's replacement for a K type whose rows are not a multiple of 256 weights
#: (``convert_incompatible_tensor`` in ``llama_tensor_get_type``, src/llama-quant.cpp, 2025).
K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def llama_cpp_type(qtype: str, row_length: int) -> str:
    """The type llama.cpp stores when asked for ``qtype`` on rows of ``row_length`` weights:
    ``qtype`` itself if the rows hold whole blocks, else :data:`K_FALLBACK`'s block-32
    replacement (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0)."""
    block, _ = block_layout(qtype)
    if isinstance(row_length, bool) or not isinstance(row_length, int) or row_length < 1:
        raise ValueError(f"row_length must be a positive int, got {row_length!r}")
    if row_length % block == 0:
        return qtype
    if qtype not in K_FALLBACK or row_length % 32:
        raise ValueError(f"{qtype} on rows of {row_length} weights has no fallback here")
    return K_FALLBACK[qtype]


def requantize_ggml(weight: np.ndarray, qtype: str) -> np.ndarray:
    """Encode ``weight`` (d_out, d_in) in ``qtype`` and decode it again: float32, same shape.

    The weights are cut into blocks in memory order (row after row). Where d_in is a
    multiple of the block this is exactly ggml's row-by-row layout; where it is not (a
    K format on 576-wide rows) a block spans two rows: the format's arithmetic, applied to
    a tensor ggml would not store (see :func:`llama_cpp_type`). The total must be whole
    blocks (a ``ValueError`` otherwise).
    """
    if not isinstance(weight, np.ndarray) or weight.ndim != 2:
        raise ValueError(f"weight must be a 2-D numpy array, got "
                         f"{weight.shape if isinstance(weight, np.ndarray) else type(weight).__name__}")
    if qtype not in QUANTIZE_TYPES:
        raise ValueError(f"cannot encode {qtype!r}; supported: {list(QUANTIZE_TYPES)}")
    block, _ = block_layout(qtype)
    if weight.size % block:
        raise ValueError(f"{qtype}: {weight.shape} holds {weight.size} weights, not a whole "
                         f"number of blocks of {block}")
    flat = np.ascontiguousarray(weight, dtype=np.float32).reshape(-1, block)  # (n_blocks, block)
    return dequantize(quantize(flat, qtype), qtype, flat.shape).reshape(weight.shape)


# ---------------------------------------------------------------- GPTQ and AWQ, block by block


class _OneBlock(nn.Module):
    """One decoder block run on stored hidden states: the smallest model that
    :func:`~.gptq.quantize_model` accepts (it needs ``blocks`` and ``model(ids)``).

    ``forward(ids)`` ignores the values of ``ids`` (B, T), which only have to match the
    stored states ``hidden`` (B, T, d), and returns the block's output (B, T, d).
    """

    def __init__(self, block: nn.Module, rope: nn.Module | None, hidden: Tensor) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([block])
        self.rope = rope
        self.register_buffer("hidden", hidden)

    def forward(self, ids: Tensor) -> Tensor:
        if tuple(ids.shape) != tuple(self.hidden.shape[:2]):
            raise ValueError(f"ids {tuple(ids.shape)} must match the stored states "
                             f"{tuple(self.hidden.shape[:2])}")
        positions = torch.arange(ids.shape[1])
        return self.blocks[0](self.hidden, positions, self.rope)


@torch.no_grad()
def quantize_blockwise(model: nn.Module, method: str, bits: int, group_size: int | None,
                       calib_ids: Tensor) -> dict[str, Tensor]:
    """What :func:`~.gptq.quantize_model` computes, one decoder block at a time.

    ``quantize_model`` captures every layer's calibration inputs by running the whole model
    up to that layer: 210 partial forward passes of a 30-layer model. Here the hidden
    states at a block's input are kept, and each block is quantised as a one-block model
    (``quantize_model`` itself, on it); then the states advance by one block: through the
    quantised block for GPTQ (each layer sees what the quantised layers before it
    produce, in float32, as in ``quantize_model``), through the float block in float64 for
    AWQ (which searches its scales on the float model's activations, as
    ``awq_scale_model`` does) and RTN. The same numbers, for the cost of about one forward
    pass per layer. ``model`` is a :class:`~llmbook.transformer.model.TransformerLM`;
    ``calib_ids`` (B, T). Returns the new state of the decoder blocks, ``{"blocks.i.…":
    tensor}`` (AWQ also changes the norm gains and up_proj rows its scales fold into);
    ``model`` is not changed.
    """
    if method not in ("rtn", "gptq", "awq"):
        raise ValueError(f"method must be 'rtn', 'gptq' or 'awq', got {method!r}")
    if not isinstance(calib_ids, Tensor) or calib_ids.ndim != 2:
        raise ValueError(f"calib_ids must have shape (B, T), got "
                         f"{tuple(calib_ids.shape) if isinstance(calib_ids, Tensor) else calib_ids!r}")
    hidden = F.embedding(calib_ids, model.embed.weight)  # (B, T, d)
    if method != "gptq":
        hidden = hidden.double()
    out: dict[str, Tensor] = {}
    for b, block in enumerate(model.blocks):
        one = _OneBlock(block, model.rope, hidden)
        quantised = quantize_model(one, method, bits, group_size, calib_ids)
        out.update({f"blocks.{b}.{k}": v for k, v in quantised.blocks[0].state_dict().items()})
        if method == "gptq":
            hidden = quantised(calib_ids)
        else:
            hidden = copy.deepcopy(one).double()(calib_ids)
    return out


# ---------------------------------------------------------------- activations


#: What :func:`linear_inputs` captures: a name -> the projection whose input it is (q_proj's
#: input is also k_proj's and v_proj's, gate_proj's also up_proj's).
LINEAR_INPUTS = {"attention input": "attn.q_proj", "o_proj input": "attn.o_proj",
                 "MLP input": "mlp.gate_proj", "down_proj input": "mlp.down_proj"}


@torch.no_grad()
def linear_inputs(model: nn.Module, ids: Tensor) -> dict[str, Tensor]:
    """The inputs of every decoder block's linear layers on one sequence, in one forward pass.

    ``model`` has ``blocks`` (a :class:`~llmbook.transformer.model.TransformerLM`); ``ids``
    (T,) token ids. Forward pre-hooks on the projections of :data:`LINEAR_INPUTS` record what
    each receives; returns name -> (L, T, d_in), in the model's dtype. The statistic AWQ
    scales by (chapter 15's outlier channels); ``gptq`` captures one layer at a time instead.
    """
    if not isinstance(ids, Tensor) or ids.ndim != 1 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids must be a 1-D integer tensor of token ids, got "
                         f"{(tuple(ids.shape), ids.dtype) if isinstance(ids, Tensor) else ids!r}")
    seen: dict[str, list[Tensor]] = {k: [] for k in LINEAR_INPUTS}
    handles = []
    for block in model.blocks:
        for kind, path in LINEAR_INPUTS.items():
            handles.append(block.get_submodule(path).register_forward_pre_hook(
                lambda _m, args, kind=kind: seen[kind].append(args[0][0].detach())))
    try:
        model(ids[None].long())
    finally:
        for h in handles:
            h.remove()
    return {k: torch.stack(v) for k, v in seen.items()}


# ---------------------------------------------------------------- the variants


#: name -> (how its 210 projections are stored, what the name means). "*" marks K-format
#: tensors encoded in memory-order blocks of 256 across rows (not storable by ggml).
VARIANTS: dict[str, str] = {
    "file": "the file's own weights: Q4_1 projections, Q8_0 embedding (the reference)",
    "Q8_0": "Q8_0 projections",
    "Q6_K*": "Q6_K projections, 256-weight blocks in memory order",
    "Q6_K": "Q6_K as llama.cpp stores it: Q8_0 on 576-wide rows, Q6_K on ffn_down",
    "Q5_K*": "Q5_K projections, 256-weight blocks in memory order",
    "Q5_K": "Q5_K as llama.cpp stores it: Q5_1 on 576-wide rows, Q5_K on ffn_down",
    "Q5_0": "Q5_0 projections",
    "Q4_K_M*": "llama.cpp's Q4_K_M mixture (Q4_K, Q6_K), 256-weight blocks in memory order",
    "Q4_K_M": "Q4_K_M as llama.cpp stores it: its mixture with the fallbacks Q5_0 and Q8_0",
    "Q4_K*": "Q4_K projections, 256-weight blocks in memory order",
    "Q4_K": "Q4_K as llama.cpp stores it: Q5_0 on 576-wide rows, Q4_K on ffn_down",
    "Q4_1": "Q4_1 projections, re-encoded (the file's own format: should change nothing)",
    "Q4_0": "Q4_0 projections",
    "Q4_0 pure": "Q4_0 everywhere, the embedding (= output layer) too (llama.cpp's --pure)",
    "NF4": "NF4 projections, groups of 64 with a float32 absmax",
    "RTN": "the book's zero-point 4-bit round-to-nearest, groups of 32",
    "GPTQ": "GPTQ, 4 bits, groups of 32",
    "AWQ": "AWQ, 4 bits, groups of 32 (o_proj keeps an explicit input scale: GQA)",
}


def _projection_types(variant: str, names: list[str], shapes: Mapping[str, tuple[int, ...]],
                      n_layers: int) -> dict[str, str]:
    """The ggml type of each projection in a ggml variant (memory-order where starred)."""
    base = variant.rstrip("*").removesuffix(" pure")
    starred = variant.endswith("*")
    if base == "Q4_K_M":
        types = q4_k_m_types(names, n_layers, None if starred else shapes)
        return {n: types[n] for n in names}
    return {n: base if starred else llama_cpp_type(base, shapes[n][-1]) for n in names}


def build_variant(variant: str, source: GGUFFile, model: nn.Module,
                  calib_ids: Tensor | None = None) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The weights of ``variant`` (a key of :data:`VARIANTS`) and how they are stored.

    ``source`` is the real file and ``model`` the book's model loaded from it (float32,
    unchanged by this). Returns (state: the book's parameter names -> float32 tensors that
    differ from the file's, storage: ``formats`` (GGUF name -> :func:`format_bits` name for
    every tensor), ``extra_bits`` and ``storable`` (whether ggml can hold every tensor as
    stated: False for the starred variants; None for the book's formats, which are not
    ggml's)). GPTQ and AWQ need ``calib_ids`` (B, T).
    """
    from llmbook.inference.gguf import book_name

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {list(VARIANTS)}")
    tensors = source.tensors
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    formats = {n: t.qtype for n, t in tensors.items()}  # the file's own types
    projections = [n for n, t in tensors.items() if len(t.shape) == 2 and n.startswith("blk.")]
    n_layers = len(model.blocks)
    params = dict(model.named_parameters())
    state: dict[str, Tensor] = {}
    extra: dict[str, int] = {}
    storable: bool | None = True
    if variant in ("GPTQ", "AWQ"):
        if calib_ids is None:
            raise ValueError(f"{variant} needs calib_ids (B, T)")
        new = quantize_blockwise(model, variant.lower(), 4, GROUP, calib_ids)
        state = {k: v for k, v in new.items() if not torch.equal(v, params[k])}
        formats.update({n: f"INT4/{GROUP}" for n in projections})
        if variant == "AWQ":  # an input scale no earlier layer can absorb: o_proj under GQA
            attn = model.blocks[0].attn
            if attn.n_kv_heads != attn.n_heads:
                extra = {n: 32 * shapes[n][-1] for n in projections if "attn_output" in n}
        storable = None
    elif variant in ("NF4", "RTN"):
        for n in projections:
            W = params[book_name(n)].detach()
            state[book_name(n)] = quantize_nf4(W, 64) if variant == "NF4" else quantize_rtn(W, 4, GROUP)
            formats[n] = "NF4/64" if variant == "NF4" else f"INT4/{GROUP}"
        storable = None
    elif variant != "file":
        types = _projection_types(variant, projections, shapes, n_layers)
        if variant.endswith(" pure"):
            types["token_embd.weight"] = variant.removesuffix(" pure")
        for n, qtype in types.items():
            weight = params[book_name(n)].detach().numpy()
            state[book_name(n)] = torch.from_numpy(requantize_ggml(weight, qtype))
            formats[n] = qtype
            storable = storable and shapes[n][-1] % block_layout(qtype)[0] == 0
    return state, {"formats": formats, "extra_bits": extra, "storable": storable}


# ---------------------------------------------------------------- the sweep


def ids_sha256(ids: Tensor) -> str:
    """SHA-256 of token ids as little-endian int32: a fingerprint of a tokenisation."""
    return hashlib.sha256(ids.to(torch.int32).numpy().astype("<i4").tobytes()).hexdigest()


def apply_state(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Replace parameters of ``model`` in place by ``state`` (parameter name -> tensor, cast
    to the parameter's dtype), e.g. a variant's weights from :func:`build_variant`."""
    params = dict(model.named_parameters())
    unknown = set(state) - set(params)
    if unknown:
        raise ValueError(f"the model has no parameters {sorted(unknown)[:3]}")
    for k, v in state.items():
        params[k].data = v.to(params[k].dtype)


@torch.no_grad()
def run_sweep(variants: list[str] | None = None, window: int = WINDOW,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Perplexity of every variant on the held-out prose, and its storage: the sweep's record.

    Loads the real model (float32) and its tokenizer, and for each variant loads its weights
    (:func:`build_variant`), scores it (:func:`perplexity` with ``window``) and counts its
    bits (:func:`storage_bits`): over the 210 projections, and over the whole model (the
    embedding at its stored type, the norms at 32 bits). Also scores the file and Q4_0 on
    the first :data:`CHECK_TOKENS` tokens in float64 (what the notebook and tests recompute).
    """
    from llmbook.inference.gguf import file_sha256, load_model, read_gguf, smollm2_path
    from llmbook.training.pretrained import machine_facts

    began = time.perf_counter()
    path = smollm2_path()
    source = read_gguf(path)
    model, tokenizer = load_model(path)
    ids, calib = heldout_ids(tokenizer), calibration_ids(tokenizer)
    sizes = {n: t.n_elements for n, t in source.tensors.items()}
    projections = [n for n, t in source.tensors.items() if len(t.shape) == 2 and n.startswith("blk.")]
    originals = {k: p.detach().clone() for k, p in model.named_parameters()}
    record: dict[str, Any] = {
        "model": {"file": path.name, "sha256": file_sha256(path),
                  "parameters": sum(sizes.values()),
                  "projection_weights": sum(sizes[n] for n in projections),
                  "embedding_weights": sizes["token_embd.weight"],
                  "norm_weights": sum(v for n, v in sizes.items() if "norm" in n)},
        "heldout": {"file": "data/heldout_prose.txt",
                    "sha256": file_sha256(HELDOUT_PROSE), "tokens": len(ids),
                    "ids_sha256": ids_sha256(ids), "window": window, "dtype": "float32"},
        "calibration": {"text": "data/stdlib_docs.txt, its first tokens",
                        "shape": list(calib.shape), "ids_sha256": ids_sha256(calib.reshape(-1)),
                        "gptq": f"4 bits, groups of {GROUP}, damp 0.01, lazy blocks of 128, "
                                "layers in forward order on the outputs of the quantised ones",
                        "awq": f"4 bits, groups of {GROUP}, alpha in 0, 0.05, ..., 1, scales "
                               "searched on the float model's activations"},
        "variants": [],
    }
    threads = torch.get_num_threads()
    for name in variants or list(VARIANTS):
        t0 = time.perf_counter()
        apply_state(model, originals)
        # one thread while quantising: GPTQ's column loop is thousands of small operations,
        # which a second thread slows down (many times over when the cores are shared)
        torch.set_num_threads(1)
        try:
            state, storage = build_variant(name, source, model, calib)
        finally:
            torch.set_num_threads(threads)
        apply_state(model, state)
        # AWQ stores W diag(s), its scales folded into the norms: a different matrix, not an error
        weight_error = None if name == "AWQ" else _relative_error(model, originals, projections)
        score = perplexity(model, ids, window)
        bits = storage_bits(storage["formats"], sizes, storage["extra_bits"])
        proj_bits = storage_bits({n: storage["formats"][n] for n in projections},
                                 {n: sizes[n] for n in projections},
                                 storage["extra_bits"])
        counts: dict[str, int] = {}
        for n in projections:
            counts[storage["formats"][n]] = counts.get(storage["formats"][n], 0) + 1
        entry = {"name": name, "label": VARIANTS[name], "storable_by_ggml": storage["storable"],
                 "projection_types": counts,
                 "embedding_type": storage["formats"]["token_embd.weight"],
                 "bits_per_weight_projections": proj_bits / record["model"]["projection_weights"],
                 "bits_per_weight_model": bits / record["model"]["parameters"],
                 "bytes": bits // 8, "weight_rel_rmse": weight_error, "nll": score.nll, "predicted_tokens": score.tokens,
                 "windows": score.windows, "perplexity": score.ppl,
                 "seconds": round(time.perf_counter() - t0, 1)}
        record["variants"].append(entry)
        log(f"{name:10s} {entry['bits_per_weight_model']:6.3f} bits/weight  "
            f"ppl {score.ppl:8.4f}  ({entry['seconds']:.0f} s)")
    apply_state(model, originals)
    record["check"] = _check_slice(model, source, ids)
    record["made"] = {"command": "python -m llmbook.inference.real_quant",
                      "date": datetime.date.today().isoformat(),
                      "seconds": round(time.perf_counter() - began), **machine_facts()}
    return record


@torch.no_grad()
def _relative_error(model: nn.Module, originals: Mapping[str, Tensor],
                    projections: list[str]) -> float:
    """sqrt(Σ (W' - W)² / Σ W²) over the projections, in float64: how far a variant moved them."""
    from llmbook.inference.gguf import book_name

    params = dict(model.named_parameters())
    num = den = 0.0
    for n in projections:
        W = originals[book_name(n)].double()
        num += float(((params[book_name(n)].double() - W) ** 2).sum())
        den += float((W**2).sum())
    return math.sqrt(num / den)


def _check_slice(model: nn.Module, source: GGUFFile, ids: Tensor) -> dict[str, Any]:
    """Perplexity of the file and of Q4_0 on the first CHECK_TOKENS tokens, in float64."""
    out: dict[str, Any] = {"tokens": CHECK_TOKENS, "dtype": "float64"}
    for name in ("file", "Q4_0"):
        state, _ = build_variant(name, source, model)
        m64 = copy.deepcopy(model)
        apply_state(m64, state)
        out[name] = perplexity(m64.double(), ids[:CHECK_TOKENS], CHECK_TOKENS).ppl
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbook.inference.real_quant [VARIANT ...] [--out FILE]``: run the sweep
    (every variant by default, several minutes on 2 cores) and write its JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m llmbook.inference.real_quant",
                                     description=main.__doc__)
    parser.add_argument("variants", nargs="*", metavar="VARIANT",
                        help=f"variants to run (default: all of {list(VARIANTS)})")
    parser.add_argument("--out", type=Path, default=SWEEP_JSON, help="where to write the JSON")
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    record = run_sweep(args.variants or None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({record['made']['seconds']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
