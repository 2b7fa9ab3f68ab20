"""Position information for attention: sinusoidal, learned, rotary (RoPE) and ALiBi.

Introduced in notebooks/05_positions. Attention without positions is permutation
equivariant: shuffling the tokens shuffles the outputs the same way, so "dog bites man"
and "man bites dog" look alike. Each scheme below breaks that symmetry differently.

* :func:`sinusoidal_positions` - the fixed table added to the token embeddings by the
  original transformer (Vaswani et al., 2017, "Attention Is All You Need", section 3.5);
  :func:`sinusoidal_shift_matrix` is the rotation that moves it by k positions.
* :class:`LearnedPositions` - a trained table of T_max rows, GPT-2's ``wpe``.
* :class:`RotaryEmbedding` - rotary position embedding (Su et al., 2021, "RoFormer:
  Enhanced Transformer with Rotary Position Embedding"): queries and keys are rotated by
  an angle proportional to their position, so q.k depends only on the offset m - n.
  :func:`apply_rotary`, :func:`rotate_half`, :func:`rope_frequencies`,
  :func:`rope_matrix` and :func:`rope_permutation` are its parts and its two layouts;
  :func:`rope_float32_angle_error_bound` bounds the float32 angle's rounding error;
  :func:`rope_inverse_frequencies` adds context-extension scaling (position interpolation,
  dynamic NTK, YaRN, Llama 3.1) and partial rotation, as Hugging Face configs specify them.
* :func:`alibi_slopes`, :func:`alibi_bias` - attention with linear biases (Press, Smith &
  Lewis, 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
  Extrapolation"): no position vectors at all, a penalty proportional to distance.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from llmbook.validation import check_positive_int

__all__ = [
    "LearnedPositions",
    "RotaryEmbedding",
    "alibi_bias",
    "alibi_slopes",
    "apply_rotary",
    "rope_float32_angle_error_bound",
    "rope_frequencies",
    "rope_inverse_frequencies",
    "rope_matrix",
    "rope_permutation",
    "rotate_half",
    "sinusoidal_positions",
    "sinusoidal_shift_matrix",
]


def _check_even(name: str, value: object) -> int:
    value = check_positive_int(name, value)
    if value % 2:
        raise ValueError(f"{name} must be even (its entries are rotated in pairs), got {name}={value}")
    return value


def _check_base(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 1:
        raise ValueError(f"{name} must be a number greater than 1, got {name}={value!r}")
    return float(value)


def _check_positions(positions: object, max_seq_len: int) -> Tensor:
    """Positions must be an integer tensor with every entry in [0, max_seq_len)."""
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_floating_point() or positions.is_complex():
        raise TypeError(
            f"positions must have an integer dtype (e.g. torch.long), got {positions.dtype}"
        )
    if positions.numel() > 0:
        lo, hi = int(positions.min()), int(positions.max())
        bad = lo if lo < 0 else hi if hi >= max_seq_len else None
        if bad is not None:
            raise ValueError(
                f"position {bad} is out of range for max_seq_len={max_seq_len} "
                f"(positions must lie in [0, {max_seq_len - 1}])"
            )
    return positions


# ---------------------------------------------------------------- sinusoidal


def sinusoidal_positions(
    num_positions: int, d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The sinusoidal position table of Vaswani et al. (2017), section 3.5: (T, d).

    PE[pos, 2i] = sin(pos * w_i) and PE[pos, 2i+1] = cos(pos * w_i), with the frequency
    w_i = base^(-2i/d) for i = 0, ..., d/2 - 1: wavelengths from 2 pi to 2 pi base. The
    table is computed in float64 and rounded once to ``dtype``. ``d_model`` must be even.
    """
    num_positions = check_positive_int("num_positions", num_positions)
    d_model = _check_even("d_model", d_model)
    base = _check_base("base", base)
    pos = torch.arange(num_positions, dtype=torch.float64)  # (T,)
    omega = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    angles = torch.outer(pos, omega)  # (T, d/2)
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (T, d/2, 2)
    return pe.reshape(num_positions, d_model).to(dtype)  # (T, d): sin, cos, sin, cos, ...


def sinusoidal_shift_matrix(
    offset: int, d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float64
) -> Tensor:
    """The (d, d) matrix M_k with PE[pos + k] = M_k PE[pos] for every pos (k = ``offset``).

    By the angle-addition formulas each (sin, cos) pair at pos + k is the pair at pos
    rotated by the angle k w_i, so M_k is block diagonal with 2x2 blocks
    [[cos k w_i, sin k w_i], [-sin k w_i, cos k w_i]]: a fixed linear map that does not
    depend on pos. As row vectors, ``PE[k:] == PE[:-k] @ M_k.T``.
    """
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {offset!r} ({type(offset).__name__})")
    d_model = _check_even("d_model", d_model)
    base = _check_base("base", base)
    omega = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    c, s = torch.cos(offset * omega), torch.sin(offset * omega)  # (d/2,)
    blocks = torch.stack((torch.stack((c, s), -1), torch.stack((-s, c), -1)), -2)  # (d/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype)  # (d, d)


# ---------------------------------------------------------------- learned


class LearnedPositions(nn.Module):
    """A learned absolute position table P of shape (T_max, d), like GPT-2's ``wpe``.

    ``forward(positions)`` looks up rows: (T,) or (B, T) integer positions -> (T, d) or
    (B, T, d); the model adds the result to the token embeddings. The table has no row
    for a position >= T_max, so such a position is an error (naming the position and
    ``max_seq_len``): a learned table cannot extrapolate. Initialisation N(0, std^2) with
    std = 0.02, as GPT-2 implementations do (Radford et al., 2019). The parameter is called
    ``weight``, so state dicts move to and from ``torch.nn.Embedding``.
    """

    def __init__(
        self,
        max_seq_len: int,
        d_model: int,
        std: float = 0.02,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        self.d_model = check_positive_int("d_model", d_model)
        if not std > 0:
            raise ValueError(f"std must be positive, got std={std}")
        self.std = float(std)
        self.weight = nn.Parameter(torch.empty(max_seq_len, d_model, dtype=dtype))  # (T_max, d)
        with torch.no_grad():
            self.weight.normal_(0.0, self.std, generator=generator)

    def forward(self, positions: Tensor) -> Tensor:
        """Rows of the table: (T,) or (B, T) integer positions -> (T, d) or (B, T, d)."""
        positions = _check_positions(positions, self.max_seq_len)
        if positions.ndim not in (1, 2):
            raise ValueError(
                f"positions must have shape (T,) or (B, T), got {tuple(positions.shape)}"
            )
        return self.weight[positions]  # (..., T, d)

    def extra_repr(self) -> str:
        return f"max_seq_len={self.max_seq_len}, d_model={self.d_model}, std={self.std}"


# ---------------------------------------------------------------- rotary (RoPE)


def rope_frequencies(
    d_head: int, theta: float = 10000.0, dtype: torch.dtype = torch.float64
) -> Tensor:
    """The RoPE angular frequencies theta_j = theta^(-2j/d_head), j = 0..d_head/2 - 1: (d/2,).

    Su et al. (2021), equation (15). Computed as ``1 / theta ** (2j / d)`` in ``dtype``,
    which in float32 is bit for bit the ``inv_freq`` of Hugging Face's Llama.
    """
    d_head = _check_even("d_head", d_head)
    theta = _check_base("theta", theta)
    return 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=dtype) / d_head))  # (d/2,)


def rope_float32_angle_error_bound(
    d_head: int, theta: float = 10000.0, pow_ulps: float = 1.0
) -> Tensor:
    """A bound on the relative error of the float32 RoPE angle m * inv_freq_j, per pair: (d/2,).

    The float32 angle is fl(m * fl(1 / fl(theta ** fl(2j / d_head)))), as in Hugging Face's
    Llama and :class:`RotaryEmbedding`. In the standard model of floating-point arithmetic
    (u = 2^-24): the exponent x_j = 2j/d is rounded once (exactly representable, so no error,
    when d_head is a power of two); an exponent error x_j delta moves theta^x_j by the factor
    exp(x_j ln(theta) delta), up to ln(theta) u for the slowest pair; the power routine is
    assumed accurate to ``pow_ulps`` units in the last place (one ulp is at most 2u relative;
    SLEEF's u10 routines and glibc's powf are within one ulp); the reciprocal and the product
    with m are rounded once each. The returned bound is, in float64,

        exp(x_j ln(theta) u_x) (1 + 2 pow_ulps u) (1 + u)^2 - 1,   u_x = 0 or u,

    so that |angle32 - m theta_j| <= m theta_j * bound_j for every integer m < 2^24.
    Introduced in notebooks/05_positions (the float32 tables).
    """
    d_head = _check_even("d_head", d_head)
    theta = _check_base("theta", theta)
    if isinstance(pow_ulps, bool) or not isinstance(pow_ulps, int | float) or not pow_ulps >= 0:
        raise ValueError(f"pow_ulps must be a number >= 0, got pow_ulps={pow_ulps!r}")
    u = 2.0**-24
    u_x = 0.0 if d_head & (d_head - 1) == 0 else u  # 2j/d is exact in binary iff d is a power of 2
    x = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head  # (d/2,)
    return torch.exp(x * math.log(theta) * u_x) * (1 + 2 * pow_ulps * u) * (1 + u) ** 2 - 1


ROPE_SCALING_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


def _scaling_number(scaling: dict, key: str, default: float | None = None) -> float:
    value = scaling.get(key, default)
    if value is None:
        raise ValueError(f"scaling of rope_type {scaling.get('rope_type')!r} needs the key {key!r}, "
                         f"got keys {sorted(scaling)}")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"scaling[{key!r}] must be a positive number, got {value!r}")
    return float(value)


def rope_inverse_frequencies(
    d_head: int,
    base: float | None = None,
    scaling: dict | None = None,
    *,
    max_position_embeddings: int | None = None,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, float]:
    """RoPE inverse frequencies with context-extension scaling, and the attention factor.

    Returns ``(inv_freq, attention_factor)``: ``inv_freq`` of shape (d_rot/2,), where
    d_rot = int(d_head * partial_rotary_factor) is the number of rotated components (all of
    them by default), and the factor by which the cos and sin tables are multiplied (1 except
    for YaRN). ``scaling`` is a Hugging Face ``rope_scaling`` (transformers 4.x) or
    ``rope_parameters`` (5.x) dict; ``None`` or ``rope_type`` "default" is plain RoPE,
    theta_j = base^(-2j/d_rot) (Su et al., 2021). The scaled types, each bit for bit the
    float32 arithmetic of ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``:

    * "linear": position interpolation (Chen et al., 2023, "Extending Context Window of Large
      Language Models via Positional Interpolation"): every theta_j divided by ``factor``.
    * "dynamic": dynamic NTK scaling (Peng et al., 2023, section 3.3): the base
      becomes base * (factor * L / L_0 - (factor - 1))^(d/(d-2)) for a sequence of length
      L = max(seq_len, L_0), L_0 = ``max_position_embeddings``; unchanged up to L_0.
    * "yarn": YaRN (Peng et al., 2023, "YaRN: Efficient Context Window Extension of Large
      Language Models"): pairs that turn more than ``beta_fast`` (32) times over the original
      context L_0 = ``original_max_position_embeddings`` keep theta_j, pairs that turn fewer
      than ``beta_slow`` (1) times get theta_j / factor, a linear ramp in between; attention
      factor 0.1 ln(factor) + 1 (or ``attention_factor``, or the ``mscale``/``mscale_all_dim``
      ratio of DeepSeek).
    * "llama3": Llama 3.1's piecewise rule (Dubey et al., 2024, "The Llama 3 Herd of
      Models"): wavelengths 2 pi / theta_j shorter than L_0 / ``high_freq_factor`` kept,
      longer than L_0 / ``low_freq_factor`` divided by ``factor``, smoothly interpolated
      between.

    ``base`` defaults to ``scaling["rope_theta"]`` (5.x dicts carry it), else 10000; the
    key "type" is read as "rope_type" (old configs). Other types (e.g. "longrope") raise a
    ValueError naming the supported ones. Introduced in notebooks/05_positions (RoPE scaling).
    """
    d_head = check_positive_int("d_head", d_head)
    scaling = {} if scaling is None else scaling
    if not isinstance(scaling, dict):
        raise TypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_SCALING_TYPES:
        raise ValueError(f"scaling rope_type {rope_type!r} is not supported; supported: {ROPE_SCALING_TYPES}")
    if base is None:
        base = scaling.get("rope_theta", 10000.0)
    base = _check_base("base", base)
    fraction = scaling.get("partial_rotary_factor", 1.0)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {fraction!r}")
    dim = _check_even("rotated dimension int(d_head * partial_rotary_factor)", int(d_head * fraction))

    def plain(b: float) -> Tensor:  # (dim/2,): 1 / b^(2j/dim), HF's float32 arithmetic
        return 1.0 / (b ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim))

    if rope_type == "default":
        return plain(base), 1.0
    if rope_type == "linear":
        return plain(base) / _scaling_number(scaling, "factor"), 1.0
    if rope_type == "dynamic":
        factor = _scaling_number(scaling, "factor")
        if max_position_embeddings is None:
            raise ValueError("scaling rope_type 'dynamic' needs max_position_embeddings (the trained length)")
        original = check_positive_int("max_position_embeddings", max_position_embeddings)
        length = original if seq_len is None else max(check_positive_int("seq_len", seq_len), original)
        return plain(base * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))), 1.0
    original = _scaling_number(scaling, "original_max_position_embeddings")
    if rope_type == "llama3":
        factor = _scaling_number(scaling, "factor")
        low, high = _scaling_number(scaling, "low_freq_factor"), _scaling_number(scaling, "high_freq_factor")
        inv_freq = plain(base)
        wavelen = 2 * math.pi / inv_freq  # (dim/2,)
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)  # 0 at L_0/low, 1 at L_0/high
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < original / high) * ~(wavelen > original / low)
        return torch.where(medium, smoothed, scaled), 1.0
    # yarn
    factor = scaling.get("factor")
    if factor is None and max_position_embeddings is None:
        raise ValueError("scaling rope_type 'yarn' needs a factor or max_position_embeddings")
    factor = (check_positive_int("max_position_embeddings", max_position_embeddings) / original
              if factor is None else _scaling_number(scaling, "factor"))

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def pair_index(n_rotations: float) -> float:  # the j whose pair turns n_rotations times in L_0
        return dim * math.log(original / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers does: avoid dividing by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1).to(dtype)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype) / dim)  # (dim/2,)
    keep = 1 - ramp  # 1: extrapolate (keep theta_j), 0: interpolate (theta_j / factor)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    return inv_freq, float(attention_factor)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) with x1, x2 the two halves of the last axis: (..., d) -> (..., d).

    With it the half-split rotation reads x cos + rotate_half(x) sin, with cos and sin
    repeated as (c_0..c_{d/2-1}, c_0..c_{d/2-1}): the form used in Hugging Face's Llama.
    """
    if not isinstance(x, Tensor) or x.ndim == 0 or x.shape[-1] % 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"rotate_half needs a last axis of even length, got {shape}")
    x1, x2 = x.chunk(2, dim=-1)  # (..., d/2) each
    return torch.cat((-x2, x1), dim=-1)  # (..., d)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Rotate the pairs of the last axis of ``x`` by the angles whose cos and sin are given.

    Pair j, with components (a, b), becomes (a cos_j - b sin_j, a sin_j + b cos_j): the
    complex number a + ib times e^(i angle_j). ``interleaved=True`` pairs (x_0, x_1),
    (x_2, x_3), ... (RoFormer, GPT-J, Meta's Llama code); ``interleaved=False`` pairs
    (x_j, x_{j + d/2}) (Hugging Face Llama/Qwen2 checkpoints).

    Shapes: ``x`` (..., d); ``cos`` and ``sin`` (..., d/2), broadcastable to x's leading
    shape without enlarging it (e.g. (T, d/2) for x of shape (B, H, T, d)).
    """
    if not isinstance(x, Tensor) or not isinstance(cos, Tensor) or not isinstance(sin, Tensor):
        raise TypeError("apply_rotary expects tensors x, cos and sin")
    if x.ndim == 0 or x.shape[-1] % 2:
        raise ValueError(f"x must have a last axis of even length, got {tuple(x.shape)}")
    half = x.shape[-1] // 2
    if cos.shape != sin.shape or cos.ndim == 0 or cos.shape[-1] != half:
        raise ValueError(
            f"cos and sin must have equal shapes (..., d/2={half}), got {tuple(cos.shape)} "
            f"and {tuple(sin.shape)} for x of shape {tuple(x.shape)}"
        )
    try:
        lead = torch.broadcast_shapes(x.shape[:-1], cos.shape[:-1])
    except RuntimeError:
        lead = None
    if lead != x.shape[:-1]:
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} do not broadcast to x of shape {tuple(x.shape)}"
        )
    return _rotate_pairs(x, cos, sin, interleaved)


def _rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """The rotation of :func:`apply_rotary` without its checks, for a decoding loop that has
    checked its shapes once (``llmbook.inference.fast_decode``)."""
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]  # (..., d/2) each
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)  # (..., d/2, 2)
        return out.flatten(-2)  # (..., d)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]  # (..., d/2) each
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)  # (..., d)


def rope_matrix(
    position: int,
    d_head: int,
    theta: float = 10000.0,
    interleaved: bool = False,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """The (d, d) orthogonal matrix R_m that RoPE applies at position m: x -> R_m x.

    Interleaved: block diagonal with the 2x2 rotations [[cos m t_j, -sin m t_j],
    [sin m t_j, cos m t_j]] on (2j, 2j+1). Half-split: the same rotations acting on
    (j, j + d/2). A teaching and testing aid; :class:`RotaryEmbedding` never builds it.
    """
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(f"position must be an int, got {position!r} ({type(position).__name__})")
    freqs = rope_frequencies(d_head, theta, dtype=torch.float64)  # (d/2,)
    c, s = torch.cos(position * freqs), torch.sin(position * freqs)  # (d/2,)
    R = torch.zeros(d_head, d_head, dtype=torch.float64)
    half = d_head // 2
    j = torch.arange(half)
    first, second = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
    R[first, first], R[first, second] = c, -s
    R[second, first], R[second, second] = s, c
    return R.to(dtype)


def rope_permutation(d_head: int) -> Tensor:
    """The permutation taking the half-split layout to the interleaved one: (d_head,) long.

    ``perm = [0, d/2, 1, d/2 + 1, ..., d/2 - 1, d - 1]``. If ``x`` is in the half-split
    layout (pairs (j, j + d/2)), then ``x[..., perm]`` is in the interleaved layout (pairs
    (2j, 2j + 1)) and ``argsort(perm)`` undoes it::

        apply_rotary(x[..., perm], cos, sin, interleaved=True)[..., argsort(perm)]
            == apply_rotary(x, cos, sin, interleaved=False)

    Applied per head to the rows of W_q and W_k it converts a checkpoint between the two
    conventions; since it is orthogonal, q.k is unchanged.
    """
    d_head = _check_even("d_head", d_head)
    half = d_head // 2
    j = torch.arange(half)
    return torch.stack((j, j + half), dim=-1).reshape(d_head)  # (d,)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al., 2021) with cached cos/sin tables.

    ``forward(x, positions)`` rotates each pair j of each head vector at position m by the
    angle m theta_j, with theta_j = theta^(-2j/d_head). Then for a query at position m and
    a key at position n, (R_m q).(R_n k) = q.(R_{n-m} k): the score depends on the
    positions only through the offset.

    Layout: ``x`` is (..., T, d_head), usually (B, H, T, d_head), queries or keys after the
    split into heads, but any leading dimensions work, as in torch ((T, d), (B, T, d), ...).
    ``positions`` holds the explicit token positions: (T,) or (1, T), shared by everything,
    or (B, T), one row per entry of x's first dimension B (then x needs at least 3
    dimensions); integers in [0, max_seq_len). A position beyond the cache is an error
    naming it (the cache is not grown silently; build the module with a larger
    ``max_seq_len``).

    ``interleaved`` picks the pairing (see :func:`apply_rotary`). The tables are computed
    in ``dtype``: in float32 with the same arithmetic as Hugging Face's
    ``LlamaRotaryEmbedding`` (angle = position * inv_freq, rounded to float32), in
    float64 to reference accuracy; an ``x`` of another dtype gets them cast to its dtype.
    They are non-persistent buffers (not in the state dict).

    ``scaling`` (default None: plain RoPE) takes a Hugging Face ``rope_scaling`` /
    ``rope_parameters`` dict and builds the tables from :func:`rope_inverse_frequencies`
    (types "linear", "yarn", "llama3"; "dynamic" depends on the sequence length, so it has
    no fixed table and is refused), with YaRN's attention factor multiplied into cos and sin
    as transformers does. A ``partial_rotary_factor`` < 1 in it rotates only the first
    d_rot = int(d_head * factor) components of each head and passes the rest through
    (GPT-NeoX and Phi's partial RoPE).
    """

    def __init__(
        self,
        d_head: int,
        theta: float = 10000.0,
        max_seq_len: int = 2048,
        interleaved: bool = False,
        dtype: torch.dtype = torch.float32,
        scaling: dict | None = None,
    ) -> None:
        super().__init__()
        self.d_head = _check_even("d_head", d_head)
        self.theta = _check_base("theta", theta)
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        self.interleaved = bool(interleaved)
        self.scaling = None if scaling is None else dict(scaling)
        self.attention_factor = 1.0
        if scaling is None:
            inv_freq = rope_frequencies(d_head, theta, dtype=dtype)  # (d/2,)
        else:
            if not isinstance(scaling, dict):
                raise TypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
            if scaling.get("rope_type", scaling.get("type")) == "dynamic":
                raise ValueError("scaling rope_type 'dynamic' changes the frequencies with the sequence "
                                 "length; use rope_inverse_frequencies(..., seq_len=...) instead")
            inv_freq, self.attention_factor = rope_inverse_frequencies(
                d_head, self.theta, scaling, dtype=dtype)  # (d_rot/2,)
        self.d_rot = 2 * inv_freq.shape[0]  # rotated components per head (d_head unless partial)
        angles = torch.arange(max_seq_len, dtype=dtype)[:, None] * inv_freq  # (T_max, d_rot/2)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:  # YaRN: transformers scales the tables
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos", cos, persistent=False)  # (T_max, d_rot/2)
        self.register_buffer("sin", sin, persistent=False)  # (T_max, d_rot/2)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x`` (..., T, d_head) at ``positions`` (T,), (1, T) or (B, T): same shape."""
        if not isinstance(x, Tensor) or x.ndim < 2 or x.shape[-1] != self.d_head:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (..., T, d_head={self.d_head}), got {shape}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
        positions = _check_positions(positions, self.max_seq_len)
        T = x.shape[-2]
        if positions.shape == (1, T):
            positions = positions[0]
        per_row = x.ndim >= 3 and positions.shape == (x.shape[0], T)
        if positions.shape != (T,) and not per_row:
            batch = f" or (B, T) = ({x.shape[0]}, {T})" if x.ndim >= 3 else ""
            raise ValueError(
                f"positions must have shape (T,) = ({T},), (1, T){batch} for x of shape "
                f"{tuple(x.shape)}, got {tuple(positions.shape)}"
            )
        cos = self.cos[positions].to(x.dtype)  # (T, d/2) or (B, T, d/2)
        sin = self.sin[positions].to(x.dtype)
        if per_row:  # (B, 1, ..., 1, T, d/2): shared by the heads and other middle axes
            middle = (1,) * (x.ndim - 3)
            cos = cos.view(cos.shape[0], *middle, T, cos.shape[-1])
            sin = sin.view(sin.shape[0], *middle, T, sin.shape[-1])
        if self.d_rot < self.d_head:  # partial RoPE: rotate the first d_rot components only
            rotated = apply_rotary(x[..., : self.d_rot], cos, sin, interleaved=self.interleaved)
            return torch.cat((rotated, x[..., self.d_rot :]), dim=-1)  # x's shape
        return apply_rotary(x, cos, sin, interleaved=self.interleaved)  # x's shape

    def extra_repr(self) -> str:
        extra = "" if self.scaling is None else f", scaling={self.scaling}"
        return (f"d_head={self.d_head}, theta={self.theta}, max_seq_len={self.max_seq_len}, "
                f"interleaved={self.interleaved}{extra}")


# ---------------------------------------------------------------- ALiBi


def alibi_slopes(n_heads: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The ALiBi head slopes m_1, ..., m_H of Press, Smith & Lewis (2022): (H,).

    For H a power of two, the geometric sequence m_h = 2^(-8h/H): 1/2, 1/4, ..., 1/256 for
    H = 8. Otherwise, with n = the largest power of two below H, the n slopes for n heads
    followed by the first H - n of the odd-numbered slopes for 2n heads (m_1, m_3, ...),
    the rule of the paper's reference code. Computed in float64, rounded to ``dtype``.
    """
    n_heads = check_positive_int("n_heads", n_heads)

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    n = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = power_of_two(n) + power_of_two(2 * n)[0::2][: n_heads - n]
    return torch.tensor(slopes, dtype=torch.float64).to(dtype)  # (H,)


def alibi_bias(
    n_heads: int, T_q: int, T_k: int | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The ALiBi attention bias -m_h (i - j), added to the scores q_i.k_j / sqrt(d_k): (H, T_q, T_k).

    Query i attends to key j at distance i - j >= 0 and pays m_h per step of distance.
    The queries are the last T_q of the T_k positions (as when decoding with a KV cache),
    so query row i sits at position i + T_k - T_q; ``T_k`` defaults to ``T_q``.
    The bias is linear in j everywhere: entries with j > i (the future) are positive and
    must be removed by the causal mask, as in the paper, which applies ALiBi only to
    causal attention.
    """
    n_heads = check_positive_int("n_heads", n_heads)
    T_q = check_positive_int("T_q", T_q)
    T_k = T_q if T_k is None else check_positive_int("T_k", T_k)
    if T_k < T_q:
        raise ValueError(f"T_k must be at least T_q (the queries are the last T_q keys), "
                         f"got T_q={T_q}, T_k={T_k}")
    slopes = alibi_slopes(n_heads, dtype=torch.float64)  # (H,)
    i = torch.arange(T_k - T_q, T_k, dtype=torch.float64)  # (T_q,) query positions
    j = torch.arange(T_k, dtype=torch.float64)  # (T_k,) key positions
    offset = j[None, :] - i[:, None]  # (T_q, T_k): j - i, = -(distance) for j <= i
    return (slopes[:, None, None] * offset).to(dtype)  # (H, T_q, T_k)
