"""Load Hugging Face ``transformers`` decoders into :class:`TransformerLM`.

GPT-2, Llama (and Llama 3.x's RoPE scaling), Qwen2, Qwen3, Mistral, OLMo 2, Gemma 2, Gemma 3
and SmolLM3.

Introduced in notebooks/07_decoder. The three families are the same decoder with different
switches, so loading one is two steps: read the switches from the Hugging Face config
(:func:`config_from_hf`), then copy every tensor to its place (:func:`from_hf`).

* **Llama / Qwen2** (``LlamaForCausalLM``, ``Qwen2ForCausalLM``): the module names of
  :class:`~llmbook.transformer.model.TransformerLM` follow theirs (``q_proj`` ... ``down_proj``), so
  ``model.layers.{l}.self_attn.q_proj.weight`` goes to ``blocks.{l}.attn.q_proj.weight``
  unchanged. The rotary tables use the half-split pairing of these checkpoints.
* **Qwen3** (``Qwen3ForCausalLM``): Llama's block with an RMSNorm on every query and key
  head before the rotation (QK-norm; ``self_attn.q_norm`` and ``k_norm`` map to the
  ``q_norm`` and ``k_norm`` of :class:`~llmbook.transformer.model.QKNormAttention`).
* **Mistral** (``MistralForCausalLM``): Llama's block with sliding-window attention.
* **OLMo 2** (``Olmo2ForCausalLM``): the norms after the sub-layers (x + Norm(f(x))), and
  QK-norm over all heads at once; its ``post_attention_layernorm`` and
  ``post_feedforward_layernorm`` become ``attn_norm`` and ``mlp_norm``.
* **Gemma 2** (``Gemma2ForCausalLM``): norms before *and* after each sub-layer (sandwich),
  GeGLU, embeddings times sqrt(d), attention scores scaled by ``query_pre_attn_scalar ** -0.5``
  and soft-capped, final logits soft-capped, sliding-window layers alternating with global
  ones; its RMSNorm multiplies by (1 + w), so every norm gain is stored as 1 + w.
* **Gemma 3** (``Gemma3ForCausalLM``, ``model_type`` "gemma3_text"): Gemma 2's block with
  QK-norm (per head) in place of the attention soft-cap, and a RoPE base of its own for the
  local layers (``rope_local_theta``; the global ones keep ``rope_theta`` and the scaling).
* **SmolLM3** (``SmolLM3ForCausalLM``): Llama's block in which the layers flagged 0 in
  ``no_rope_layers`` (every fourth by default) have no rotation (NoPE).
* **Llama 3.x** RoPE scaling (``rope_type`` "llama3", and "linear") is read into
  ``TransformerConfig.rope_scaling``.
* **GPT-2** (``GPT2LMHeadModel``): its linear layers are ``Conv1D`` modules that compute
  x W + b with W stored as (d_in, d_out), the transpose of ``nn.Linear``'s (d_out, d_in);
  and its attention keeps W_Q, W_K, W_V side by side in one (d, 3d) matrix ``c_attn``.
  So every weight is transposed, and ``c_attn`` is split into three d-wide column blocks.

The other way, :func:`to_hf_llama` hands a Llama-style book model (pre-norm RMSNorm, RoPE
pairs of either kind, SwiGLU, optional grouped-query attention, tied or untied embeddings)
to ``transformers``' own ``LlamaForCausalLM``: the same weights in another implementation of
attention, RoPE, the norms and the KV cache (chapter 13 decodes SmolLM2 with both).

Only what the book's model implements is accepted: an unsupported architecture, another RoPE scaling, Qwen's per-layer sliding windows, attention
dropout or GPT-2's per-layer attention scaling is a ``ValueError`` naming it. :func:`randomize_parameters_` adds noise to every parameter of a
freshly initialised model, so that a comparison exercises the norm gains and biases too
(a new Hugging Face model has them at exactly 1 and 0).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor, nn

from llmbook.transformer.model import TransformerConfig, TransformerLM

__all__ = ["config_from_hf", "from_hf", "randomize_parameters_", "to_hf_llama"]

SUPPORTED = ("gpt2", "llama", "qwen2", "qwen3", "mistral", "olmo2", "gemma2", "gemma3_text", "smollm3")


def _model_type(hf_model: object) -> str:
    config = getattr(hf_model, "config", None)
    model_type = getattr(config, "model_type", None)
    name = type(hf_model).__name__
    if model_type not in SUPPORTED or not name.endswith(("LMHeadModel", "ForCausalLM")):
        raise ValueError(f"unsupported model {name} (model_type={model_type!r}); from_hf "
                         f"takes GPT-2, Llama, Qwen2, Qwen3, Mistral, OLMo 2, Gemma 2, Gemma 3 and SmolLM3 causal LMs "
                         f"(model_type in {list(SUPPORTED)})")
    return model_type


def _rope(hf_config: object) -> tuple[float, dict | None]:
    """RoPE base and scaling from ``rope_parameters`` (transformers 5.x) or ``rope_theta`` (4.x).

    The scaling is None for plain RoPE, else the dict (types "linear" and "llama3")."""
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise ValueError(f"unsupported RoPE variant rope_type={rope_type!r} "
                         f"(supported: 'default', 'linear', 'llama3')")
    if params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("unsupported partial RoPE (partial_rotary_factor != 1)")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ValueError("the Hugging Face config has no rope_theta")
    return float(theta), (None if rope_type == "default" else params)


def config_from_hf(hf_model: nn.Module) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face GPT-2, Llama, Qwen2 or Qwen3 causal LM.

    An option the book's model does not implement is a ``ValueError`` naming it."""
    kind = _model_type(hf_model)
    hc = hf_model.config
    if kind in ("gemma2", "gemma3_text"):
        return _gemma_config(hc, kind)
    if kind == "gpt2":
        for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
            if getattr(hc, flag, False):
                raise ValueError(f"unsupported GPT-2 option {flag}=True")
        if not getattr(hc, "scale_attn_weights", True):
            raise ValueError("unsupported GPT-2 option scale_attn_weights=False")
        return TransformerConfig.gpt2_style(
            vocab_size=hc.vocab_size, d_model=hc.n_embd, n_layers=hc.n_layer, n_heads=hc.n_head,
            max_seq_len=hc.n_positions, d_ff=hc.n_inner or 4 * hc.n_embd,
            norm_eps=hc.layer_norm_epsilon, activation=hc.activation_function,
            tie_embeddings=bool(hc.tie_word_embeddings))
    if kind != "mistral" and getattr(hc, "use_sliding_window", False):
        raise ValueError("unsupported option use_sliding_window=True (sliding-window attention)")
    layer_types = set(getattr(hc, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ValueError(f"unsupported layer_types {sorted(layer_types)} (only 'full_attention')")
    if getattr(hc, "attention_dropout", 0.0):
        raise ValueError(f"unsupported attention_dropout={hc.attention_dropout} (only 0)")
    if hc.hidden_act not in ("silu", "swish"):
        raise ValueError(f"unsupported hidden_act={hc.hidden_act!r} for SwiGLU (need 'silu')")
    if kind in ("llama", "qwen3", "mistral", "olmo2", "smollm3"):
        attn_bias = bool(getattr(hc, "attention_bias", False))
        bias = dict(qkv_bias=attn_bias, out_bias=attn_bias,
                    mlp_bias=bool(getattr(hc, "mlp_bias", False)))
    else:  # qwen2: bias on q, k, v only
        bias = dict(qkv_bias=True, out_bias=False, mlp_bias=False)
    theta, scaling = _rope(hc)
    # SmolLM3: no_rope_layers[l] is 1 where layer l uses RoPE, 0 where it has none (NoPE)
    nope = tuple(i for i, uses in enumerate(getattr(hc, "no_rope_layers", None) or []) if not uses)
    return TransformerConfig.llama_style(
        vocab_size=hc.vocab_size, d_model=hc.hidden_size, n_layers=hc.num_hidden_layers,
        n_heads=hc.num_attention_heads, n_kv_heads=hc.num_key_value_heads,
        d_head=getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads,
        d_ff=hc.intermediate_size, max_seq_len=hc.max_position_embeddings,
        norm_eps=hc.rms_norm_eps, rope_theta=theta, rope_scaling=scaling,
        tie_embeddings=bool(hc.tie_word_embeddings), qk_norm=kind in ("qwen3", "olmo2"),
        qk_norm_scope="all" if kind == "olmo2" else "head",
        norm_position="post" if kind == "olmo2" else "pre",
        sliding_window=getattr(hc, "sliding_window", None) if kind == "mistral" else None,
        no_rope_layers=nope if kind == "smollm3" and nope else None, **bias)


def _gemma_config(hc: object, kind: str) -> TransformerConfig:
    """Gemma 2 (Riviere et al., 2024): Llama's block with sandwich norms, GeGLU, sqrt(d)-scaled
    embeddings, soft-capped attention scores and logits, the score scale
    ``query_pre_attn_scalar ** -0.5`` and local (sliding) layers alternating with global ones.
    Gemma 3 (Gemma Team, 2025): the same with QK-norm instead of the attention soft-cap, and
    its own RoPE base (and scaling) for the global and the local layers."""
    if getattr(hc, "use_bidirectional_attention", None):
        raise ValueError("unsupported option use_bidirectional_attention=True (the model is causal)")
    if getattr(hc, "attention_dropout", 0.0):
        raise ValueError(f"unsupported attention_dropout={hc.attention_dropout} (only 0)")
    act = getattr(hc, "hidden_activation", None) or getattr(hc, "hidden_act", None)
    if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu_tanh"):
        raise ValueError(f"unsupported hidden_activation={act!r} for GeGLU (need 'gelu_pytorch_tanh')")
    layer_types = tuple(hc.layer_types)
    local_theta = None
    if kind == "gemma3_text":  # rope_parameters: one dict per layer type
        per_type = dict(hc.rope_parameters)
        theta, scaling = _rope(SimpleNamespace(rope_parameters=per_type["full_attention"]))
        local_theta, local_scaling = _rope(SimpleNamespace(rope_parameters=per_type["sliding_attention"]))
        if local_scaling is not None:
            raise ValueError(f"unsupported RoPE scaling on the sliding layers: {local_scaling!r}")
    else:
        theta, scaling = _rope(hc)
    unknown = set(layer_types) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ValueError(f"unsupported layer_types {sorted(unknown)}")
    bias = bool(getattr(hc, "attention_bias", False))
    return TransformerConfig.llama_style(
        vocab_size=hc.vocab_size, d_model=hc.hidden_size, n_layers=hc.num_hidden_layers,
        n_heads=hc.num_attention_heads, n_kv_heads=hc.num_key_value_heads, d_head=hc.head_dim,
        d_ff=hc.intermediate_size, max_seq_len=hc.max_position_embeddings, norm_eps=hc.rms_norm_eps,
        rope_theta=theta, rope_scaling=scaling, tie_embeddings=bool(hc.tie_word_embeddings),
        qkv_bias=bias, out_bias=bias, mlp="geglu", activation="gelu_tanh", norm_position="sandwich",
        # transformers keeps sqrt(d) in a float32 buffer: the same rounded number here
        embed_scale=float(torch.tensor(hc.hidden_size ** 0.5, dtype=torch.float32)),
        attn_scale=hc.query_pre_attn_scalar ** -0.5, attn_softcap=hc.attn_logit_softcapping,
        final_softcap=hc.final_logit_softcapping, layer_types=layer_types, qk_norm=kind == "gemma3_text",
        rope_local_theta=local_theta if "sliding_attention" in layer_types else None,
        sliding_window=hc.sliding_window if "sliding_attention" in layer_types else None)


def _gpt2_state(sd: dict[str, Tensor], n_layers: int, d: int, tied: bool) -> dict[str, Tensor]:
    """GPT-2's state dict renamed to ours: Conv1D weights transposed, c_attn split in three."""
    out = {"embed.weight": sd["transformer.wte.weight"],
           "pos_embed.weight": sd["transformer.wpe.weight"],
           "final_norm.weight": sd["transformer.ln_f.weight"],
           "final_norm.bias": sd["transformer.ln_f.bias"]}
    if not tied:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for layer in range(n_layers):
        src, dst = f"transformer.h.{layer}.", f"blocks.{layer}."
        W_qkv, b_qkv = sd[src + "attn.c_attn.weight"], sd[src + "attn.c_attn.bias"]  # (d, 3d)
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            out[dst + f"attn.{name}.weight"] = W_qkv[:, i * d:(i + 1) * d].T  # (d_out, d_in)
            out[dst + f"attn.{name}.bias"] = b_qkv[i * d:(i + 1) * d]
        pairs = {"attn.c_proj": "attn.o_proj", "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}
        for ours_from, ours_to in pairs.items():
            out[dst + ours_to + ".weight"] = sd[src + ours_from + ".weight"].T
            out[dst + ours_to + ".bias"] = sd[src + ours_from + ".bias"]
        for ln, ours in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
            out[dst + ours + ".weight"] = sd[src + ln + ".weight"]
            out[dst + ours + ".bias"] = sd[src + ln + ".bias"]
    return out


def _llama_state(sd: dict[str, Tensor], n_layers: int, tied: bool,
                 norm_position: str = "pre") -> dict[str, Tensor]:
    """Llama/Qwen2/Qwen3/Mistral/OLMo 2's state dict renamed to ours (no tensor changes).

    Pre-norm models: ``input_layernorm`` -> ``attn_norm``, ``post_attention_layernorm`` (the
    norm *before* the MLP, despite its name) -> ``mlp_norm``. OLMo 2 (``post_norm``):
    ``post_attention_layernorm`` -> ``attn_norm``, ``post_feedforward_layernorm`` -> ``mlp_norm``.
    Gemma 2 (``"sandwich"``): ``input_layernorm``, ``post_attention_layernorm``,
    ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` -> ``attn_norm``,
    ``attn_post_norm``, ``mlp_norm`` and ``mlp_post_norm``."""
    out = {"embed.weight": sd["model.embed_tokens.weight"],
           "final_norm.weight": sd["model.norm.weight"]}
    if not tied:
        out["lm_head.weight"] = sd["lm_head.weight"]
    renames = {"self_attn.": "attn.", "mlp.": "mlp."}
    renames |= {
        "pre": {"input_layernorm.": "attn_norm.", "post_attention_layernorm.": "mlp_norm."},
        "post": {"post_attention_layernorm.": "attn_norm.", "post_feedforward_layernorm.": "mlp_norm."},
        "sandwich": {"input_layernorm.": "attn_norm.", "post_attention_layernorm.": "attn_post_norm.",
                     "pre_feedforward_layernorm.": "mlp_norm.", "post_feedforward_layernorm.": "mlp_post_norm."},
    }[norm_position]
    for key, value in sd.items():
        if not key.startswith("model.layers."):
            continue
        rest = key[len("model.layers."):]  # "{l}.self_attn.q_proj.weight"
        layer, tail = rest.split(".", 1)
        prefix = next(p for p in renames if tail.startswith(p))
        out[f"blocks.{layer}.{renames[prefix]}{tail[len(prefix):]}"] = value
    return out


def from_hf(hf_model: nn.Module) -> TransformerLM:
    """A :class:`TransformerLM` with the configuration and weights of ``hf_model``.

    ``hf_model`` is a ``transformers`` ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
    ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``MistralForCausalLM``,
    ``Olmo2ForCausalLM``, ``Gemma2ForCausalLM`` or ``Gemma3ForCausalLM``; the result has its dtype and device, and computes the same logits
    (to round-off) for the same ids. The weights are copied, not shared. Anything else is a
    ``ValueError`` naming the class and ``model_type``.
    """
    config = config_from_hf(hf_model)
    sd = hf_model.state_dict()
    if config.positions == "learned":
        state = _gpt2_state(sd, config.n_layers, config.d_model, config.tie_embeddings)
    else:
        state = _llama_state(sd, config.n_layers, config.tie_embeddings, config.norm_position)
    if hf_model.config.model_type in ("gemma2", "gemma3_text"):  # Gemma's RMSNorm multiplies by (1 + w): store the gain 1 + w
        state = {k: v + 1 if k.endswith("norm.weight") else v for k, v in state.items()}
    dtype = sd["lm_head.weight"].dtype if "lm_head.weight" in sd else next(iter(sd.values())).dtype
    device = next(iter(sd.values())).device
    with torch.device(device):
        model = TransformerLM(config).to(dtype)
    model.load_state_dict({k: v.detach() for k, v in state.items()}, strict=True)
    return model


def to_hf_llama(model: TransformerLM) -> nn.Module:
    """``transformers``' ``LlamaForCausalLM`` with the configuration and weights of ``model``.

    The inverse of :func:`from_hf` for Llama-style models (Touvron et al., 2023): pre-norm
    RMSNorm without biases, RoPE without scaling, SwiGLU, no QK-norm,
    soft-caps, sliding windows, NoPE layers or embedding scale; biases on the attention
    projections (all four or none) and the MLP follow ``attention_bias`` and ``mlp_bias``.
    ``transformers`` rotates half-split pairs (i, i + d_head/2); a model that rotates
    interleaved pairs (2i, 2i + 1), as one read from a GGUF file does, has the rows of each
    query and key head reordered to match, which gives the same scores.
    The result is in eval mode with ``model``'s dtype and device, and computes the same logits
    (to round-off) for the same ids; the weights are copied, not shared. Any other option is a
    ``ValueError`` naming it.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    c = model.config
    unsupported = {
        "norm": (c.norm, "rmsnorm"), "positions": (c.positions, "rope"), "mlp": (c.mlp, "swiglu"),
        "norm_position": (c.norm_position, "pre"),
        "qk_norm": (c.qk_norm, False), "sliding_window": (c.sliding_window, None),
        "rope_scaling": (c.rope_scaling, None), "layer_types": (c.layer_types, None),
        "no_rope_layers": (c.no_rope_layers, None), "embed_scale": (c.embed_scale, 1.0),
        "attn_scale": (c.attn_scale, None), "attn_softcap": (c.attn_softcap, None),
        "final_softcap": (c.final_softcap, None), "norm_bias": (c.norm_bias, False),
    }
    for name, (got, want) in unsupported.items():
        if got != want:
            raise ValueError(f"to_hf_llama needs {name}={want!r} (a Llama-style model), got {got!r}")
    if c.qkv_bias != c.out_bias:
        raise ValueError(f"Llama's attention_bias covers q, k, v and o alike; got qkv_bias="
                         f"{c.qkv_bias} and out_bias={c.out_bias}")
    if c.d_model % c.n_heads:
        raise ValueError(f"transformers' Llama needs d_model divisible by n_heads, got d_model="
                         f"{c.d_model} and n_heads={c.n_heads}")
    from transformers import LlamaConfig, LlamaForCausalLM

    hc = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
                     num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                     num_key_value_heads=c.n_kv_heads, head_dim=c.d_head,
                     max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
                     rope_theta=c.rope_theta, tie_word_embeddings=c.tie_embeddings,
                     attention_bias=c.qkv_bias, mlp_bias=c.mlp_bias, hidden_act="silu")
    sd = model.state_dict()
    first = next(iter(sd.values()))
    try:  # skip the random initialisation of weights that are overwritten next
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights
    with torch.device(first.device), no_init_weights():
        hf = LlamaForCausalLM(hc).to(first.dtype)
    ours = _llama_state({k: k for k in hf.state_dict()}, c.n_layers, c.tie_embeddings)  # book -> HF name
    state = {ours[k]: v.detach().clone() for k, v in sd.items() if k in ours}
    if c.rope_interleaved:  # pairs (2i, 2i+1) -> HF's half-split pairs (i, i + d_head/2)
        order = torch.cat([torch.arange(0, c.d_head, 2), torch.arange(1, c.d_head, 2)])
        for proj, heads in (("q_proj", c.n_heads), ("k_proj", c.n_kv_heads)):
            for layer in range(c.n_layers):
                for kind in ("weight", "bias"):
                    name = f"model.layers.{layer}.self_attn.{proj}.{kind}"
                    if name in state:
                        t = state[name]
                        state[name] = t.reshape(heads, c.d_head, *t.shape[1:])[:, order].reshape(t.shape)
    missing = set(hf.state_dict()) - set(state) - ({"lm_head.weight"} if c.tie_embeddings else set())
    if missing:
        raise ValueError(f"to_hf_llama: no book tensor for {sorted(missing)[:4]}")
    hf.load_state_dict(state, strict=not c.tie_embeddings)
    if c.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


@torch.no_grad()
def randomize_parameters_(model: nn.Module, std: float = 0.1,
                          generator: torch.Generator | None = None) -> nn.Module:
    """Add N(0, std^2) noise to every parameter of ``model``, in place; return the model.

    A testing aid: a new model has its norm gains at exactly 1 and its biases at 0, so a
    loader that forgot to copy them, or copied a bias into the wrong place, would still
    produce matching logits. Tied parameters are visited once, so they stay tied.
    """
    if not std > 0:
        raise ValueError(f"std must be positive, got std={std}")
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) * std)
    return model
