"""Tensor parallelism: Megatron's column- and row-parallel layers with the f/g operators.

Introduced in notebooks/22_distributed_training. Shoeybi et al. (2019, "Megatron-LM: Training
Multi-Billion Parameter Language Models Using Model Parallelism", section 3) split each
matrix of a transformer block over the p ranks of a tensor-parallel group:

* a **column-parallel** linear layer Y = X A with A = [A_1, ..., A_p] split by *output*
  columns: rank i computes Y_i = X A_i, a slice of the output, from the whole input;
* a **row-parallel** linear layer Z = Y B with B split by *input* rows, B = [B_1; ...; B_p]:
  rank i computes the partial product Y_i B_i, and Z = sum_i Y_i B_i needs one all-reduce.

Column then row needs no communication in between: the MLP's elementwise GELU applies to
each slice Y_i, and attention's heads are independent, so rank i owns H/p whole heads (its
slice of W_Q, W_K, W_V by output rows, of W_O by input columns). Two conjugate operators
carry the communication (Megatron's figure 3):

* f (:class:`CopyToParallelRegion`): identity forward, all-reduce of the gradient backward
  (each rank's input gradient is only its slice's contribution);
* g (:class:`ReduceFromParallelRegion`): all-reduce forward, identity backward.

A block f -> column -> ... -> row -> g costs one all-reduce of B*T*d elements forward and
one backward. A :class:`CommCounter` passed to the layers records every all-reduce the
operators make (its kind and element count), so the chapter checks the communication volume
against its formula exactly: a ring all-reduce (Patarasuk & Yuan 2009) sends
2 (p-1)/p * n elements per rank (:func:`ring_all_reduce_bytes_per_rank`).

The layers are built from the book's single-process layers (:class:`~llmbook.transformer.layers.MLP`,
:class:`~llmbook.transformer.attention.MultiHeadAttention`) by sharding their weights, so the
two can be compared: :func:`run_tensor_parallel_layer` is the per-rank worker for
:func:`llmbook.scale.launch.run`, :func:`single_process_reference` the reference and
:func:`gather_sharded` reassembles the sharded weight gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import sympy as sp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.scale.collectives import ring_all_reduce_bytes_per_rank, ring_all_reduce_cost_symbolic
from llmbook.transformer.attention import (
    MultiHeadAttention,
    causal_mask,
    scaled_dot_product_attention,
)
from llmbook.transformer.layers import MLP, get_activation
from llmbook.validation import (
    check_finite,
    check_floating_tensor,
    check_index,
    check_positive_int,
    check_same_dtype,
)

__all__ = [
    "ColumnParallelLinear",
    "CommCounter",
    "CopyToParallelRegion",
    "ParallelAttention",
    "ParallelMLP",
    "ReduceFromParallelRegion",
    "RowParallelLinear",
    "copy_to_parallel_region",
    "gather_sharded",
    "reduce_from_parallel_region",
    "activation_all_reduce_bytes_symbolic",
    "run_tensor_parallel_layer",
    "run_tensor_parallel_layers",
    "shard_range",
    "single_process_reference",
    "tp_block_comm_symbolic",
]


# ---------------------------------------------------------------- counting communication


@dataclass
class CommCounter:
    """Records the all-reduces made by the f and g operators: ``(kind, numel, bytes per element)``.

    ``kind`` is ``"g forward"`` or ``"f backward"``. One counter per rank; every rank records
    the same calls, since every rank joins every collective.
    """

    calls: list[tuple[str, int, int]] = field(default_factory=list)

    def record(self, kind: str, t: Tensor) -> None:
        self.calls.append((kind, t.numel(), t.element_size()))

    def reset(self) -> None:
        self.calls.clear()

    @property
    def n_calls(self) -> int:
        return len(self.calls)

    @property
    def elements(self) -> int:
        """Total elements all-reduced (the size of the messages, not what the ring sends)."""
        return sum(n for _, n, _ in self.calls)

    def ring_bytes_per_rank(self, world_size: int) -> Fraction:
        """Bytes each rank sends if every recorded all-reduce is a ring all-reduce over p ranks."""
        return sum((ring_all_reduce_bytes_per_rank(n, world_size, b) for _, n, b in self.calls),
                   Fraction(0))


def activation_all_reduce_bytes_symbolic() -> sp.Expr:
    """SymPy: per-rank bytes of a ring all-reduce of an activation (B, T, d), b bytes each.

    Chapter 22's derivation (:func:`~llmbook.scale.collectives.ring_all_reduce_cost_symbolic`:
    two phases of p - 1 steps, each sending one chunk of n/p bytes) with n = B T d b.
    """
    B, T, d, p, b = sp.symbols("B T d p b", positive=True, integer=True)
    derived = ring_all_reduce_cost_symbolic()["bytes_per_rank"]
    n_, p_ = sp.Symbol("n", positive=True), sp.Symbol("p", positive=True)
    return sp.factor(derived.subs({n_: B * T * d * b, p_: p}))


def tp_block_comm_symbolic() -> dict[str, sp.Expr]:
    """SymPy: tensor-parallel communication of one layer, forward + backward, bytes per rank.

    The MLP (f, column, GELU, row, g) does one all-reduce forward (g) and one backward (f);
    attention does the same; a transformer block (attention + MLP) does four. Each moves an
    activation of B T d elements. Returns the per-rank bytes for ``"mlp"``, ``"attention"``,
    ``"block"`` and the counts ``"allreduces_mlp"``, ... as SymPy integers.
    """
    per = activation_all_reduce_bytes_symbolic()
    return {"allreduces_mlp": sp.Integer(2), "allreduces_attention": sp.Integer(2),
            "allreduces_block": sp.Integer(4),
            "mlp": 2 * per, "attention": 2 * per, "block": 4 * per}


def _all_reduce_(t: Tensor, kind: str, counter: CommCounter | None, group: Any) -> Tensor:
    """Sum ``t`` in place over the group (nothing to do in a single process), recording it."""
    if counter is not None:
        counter.record(kind, t)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


class CopyToParallelRegion(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, counter: CommCounter | None, group: Any) -> Tensor:
        ctx.counter, ctx.group = counter, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        grad = grad.contiguous().clone()
        return _all_reduce_(grad, "f backward", ctx.counter, ctx.group), None, None


class ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, counter: CommCounter | None, group: Any) -> Tensor:
        return _all_reduce_(x.contiguous().clone(), "g forward", counter, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return grad, None, None


def copy_to_parallel_region(x: Tensor, counter: CommCounter | None = None,
                            group: Any = None) -> Tensor:
    """f(x): x unchanged; its gradient is summed over the tensor-parallel group."""
    return CopyToParallelRegion.apply(x, counter, group)


def reduce_from_parallel_region(x: Tensor, counter: CommCounter | None = None,
                                group: Any = None) -> Tensor:
    """g(x): the sum of x over the tensor-parallel group; its gradient passes unchanged."""
    return ReduceFromParallelRegion.apply(x, counter, group)


# ---------------------------------------------------------------- the layers


def shard_range(size: int, rank: int, world_size: int, what: str = "size") -> slice:
    """The slice of ``range(size)`` that rank owns when size is split evenly over world_size.

    Raises ValueError if world_size does not divide size (Megatron requires it too) or the
    rank is out of range.
    """
    size = check_positive_int(what, size)
    p = check_positive_int("world_size", world_size)
    check_index("rank", rank, p)
    if size % p != 0:
        raise ValueError(f"world_size={p} does not divide {what}={size}: tensor parallelism "
                         f"splits it into equal shards")
    n = size // p
    return slice(rank * n, (rank + 1) * n)


def _check_float_tensor(x: object, name: str, last: int) -> Tensor:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if x.shape[-1] != last:
        raise ValueError(f"{name} must have last dimension {last}, got shape {tuple(x.shape)}")
    return x


def _check_weight_bias(weight: object, bias: object) -> None:
    """A shard's weight (d_out, d_in) and bias (d_out,) or None: floating, of one dtype."""
    check_floating_tensor(weight, "weight")
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-d (d_out, d_in), got shape {tuple(weight.shape)}")
    if bias is not None:
        check_same_dtype(check_floating_tensor(bias, "bias"), "bias", weight, "weight")
        if bias.shape != weight.shape[:1]:
            raise ValueError(f"bias must have shape (d_out,) = ({weight.shape[0]},), got {tuple(bias.shape)}")


class ColumnParallelLinear(nn.Module):
    """Y_i = f(X) A_i^T + b_i: rank i's slice of the output features (Megatron's A split by columns).

    Holds ``weight`` (d_out/p, d_in) and ``bias`` (d_out/p,). Input (..., d_in) -> output
    (..., d_out/p). With ``copy_input=False`` the caller applies f itself (several
    column-parallel layers reading one input share one f, as Q, K and V do).
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, counter: CommCounter | None = None,
                 copy_input: bool = True, group: Any = None) -> None:
        super().__init__()
        _check_weight_bias(weight, bias)
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.counter, self.copy_input, self.group = counter, copy_input, group

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world_size: int,
                    counter: CommCounter | None = None, copy_input: bool = True,
                    group: Any = None) -> ColumnParallelLinear:
        """Shard a full ``nn.Linear``: rank keeps its block of output rows of the weight."""
        rows = shard_range(linear.out_features, rank, world_size, "out_features")
        bias = None if linear.bias is None else linear.bias[rows]
        return cls(linear.weight[rows], bias, counter, copy_input, group)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_float_tensor(x, "x", self.weight.shape[1])
        if self.copy_input:
            x = copy_to_parallel_region(x, self.counter, self.group)
        return F.linear(x, self.weight, self.bias)  # (..., d_out / p)


class RowParallelLinear(nn.Module):
    """Z = g(Y_i B_i^T) + b: rank i multiplies its slice of the input by its rows of B.

    Holds ``weight`` (d_out, d_in/p) and the full ``bias`` (d_out,), added once after the
    all-reduce (every rank holds it; its gradient is the same on every rank). Input
    (..., d_in/p) -> output (..., d_out).
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, counter: CommCounter | None = None,
                 group: Any = None) -> None:
        super().__init__()
        _check_weight_bias(weight, bias)
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.counter, self.group = counter, group

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world_size: int,
                    counter: CommCounter | None = None, group: Any = None) -> RowParallelLinear:
        """Shard a full ``nn.Linear``: rank keeps its block of input columns of the weight."""
        cols = shard_range(linear.in_features, rank, world_size, "in_features")
        return cls(linear.weight[:, cols], linear.bias, counter, group)

    def forward(self, y: Tensor) -> Tensor:
        y = _check_float_tensor(y, "y", self.weight.shape[1])
        z = reduce_from_parallel_region(F.linear(y, self.weight), self.counter, self.group)
        return z if self.bias is None else z + self.bias  # (..., d_out)


class ParallelMLP(nn.Module):
    """The book's :class:`~llmbook.transformer.layers.MLP` split over p ranks: column then row.

    ``fc`` is column-parallel (d_ff/p hidden units per rank), the activation acts on the
    local slice, ``proj`` is row-parallel. One all-reduce forward (g), one backward (f).
    """

    def __init__(self, mlp: MLP, rank: int, world_size: int, counter: CommCounter | None = None,
                 group: Any = None) -> None:
        super().__init__()
        if not isinstance(mlp, MLP):
            raise TypeError(f"mlp must be an llmbook MLP, got {type(mlp).__name__}")
        self.fc = ColumnParallelLinear.from_linear(mlp.fc, rank, world_size, counter, group=group)
        self.proj = RowParallelLinear.from_linear(mlp.proj, rank, world_size, counter, group)
        self.act = get_activation(mlp.activation)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))  # (..., d) -> (..., d_ff/p) -> (..., d)

    def sharded_grads(self) -> dict[str, tuple[Tensor, int | None]]:
        """Gradients named as in the MLP's state dict, with the dimension they are split on
        (None: replicated, the full gradient on every rank)."""
        out = {"fc.weight": (self.fc.weight.grad, 0), "proj.weight": (self.proj.weight.grad, 1)}
        if self.fc.bias is not None:
            out["fc.bias"] = (self.fc.bias.grad, 0)
            out["proj.bias"] = (self.proj.bias.grad, None)
        return out


class ParallelAttention(nn.Module):
    """The book's causal :class:`~llmbook.transformer.attention.MultiHeadAttention`, heads split over p ranks.

    Rank i owns H/p query heads and H_kv/p key/value heads (both must divide by p): the rows
    of W_Q, W_K, W_V for those heads (column-parallel, behind one f) and the matching columns
    of W_O (row-parallel, then g). Shapes: x (B, T, d) -> q (B, H/p, T, d_head) -> (B, T, d).
    """

    def __init__(self, attn: MultiHeadAttention, rank: int, world_size: int,
                 counter: CommCounter | None = None, group: Any = None) -> None:
        super().__init__()
        if not isinstance(attn, MultiHeadAttention):
            raise TypeError(f"attn must be an llmbook MultiHeadAttention, got {type(attn).__name__}")
        p = check_positive_int("world_size", world_size)
        for what, n in (("n_heads", attn.n_heads), ("n_kv_heads", attn.n_kv_heads)):
            if n % p != 0:
                raise ValueError(f"world_size={p} does not divide {what}={n}: tensor "
                                 f"parallelism gives each rank whole heads")
        self.d_model, self.d_head, self.scale = attn.d_model, attn.d_head, attn.scale
        self.n_heads, self.n_kv_heads = attn.n_heads // p, attn.n_kv_heads // p  # local
        self.counter, self.group = counter, group
        col = {"counter": counter, "copy_input": False, "group": group}
        self.q_proj = ColumnParallelLinear.from_linear(attn.q_proj, rank, p, **col)
        self.k_proj = ColumnParallelLinear.from_linear(attn.k_proj, rank, p, **col)
        self.v_proj = ColumnParallelLinear.from_linear(attn.v_proj, rank, p, **col)
        self.o_proj = RowParallelLinear.from_linear(attn.o_proj, rank, p, counter, group)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_float_tensor(x, "x", self.d_model)
        if x.ndim != 3:
            raise ValueError(f"x must have shape (B, T, d_model), got {tuple(x.shape)}")
        B, T, _ = x.shape
        x = copy_to_parallel_region(x, self.counter, self.group)  # one f for Q, K and V
        q = self.q_proj(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)
        groups = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # (B, H/p, T, d_head)
        z = scaled_dot_product_attention(q, k, v, mask=causal_mask(T, device=x.device),
                                         scale=self.scale)
        z = z.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)  # (B, T, H d_head / p)
        return self.o_proj(z)  # (B, T, d)

    def sharded_grads(self) -> dict[str, tuple[Tensor, int | None]]:
        """Gradients named as in the attention's state dict, with their split dimension."""
        out: dict[str, tuple[Tensor, int | None]] = {}
        for name in ("q_proj", "k_proj", "v_proj"):
            layer = getattr(self, name)
            out[f"{name}.weight"] = (layer.weight.grad, 0)
            if layer.bias is not None:
                out[f"{name}.bias"] = (layer.bias.grad, 0)
        out["o_proj.weight"] = (self.o_proj.weight.grad, 1)
        if self.o_proj.bias is not None:
            out["o_proj.bias"] = (self.o_proj.bias.grad, None)
        return out


# ---------------------------------------------------------------- running and comparing


def _parallel_layer(layer: nn.Module, rank: int, world_size: int,
                    counter: CommCounter) -> ParallelMLP | ParallelAttention:
    if isinstance(layer, MLP):
        return ParallelMLP(layer, rank, world_size, counter)
    if isinstance(layer, MultiHeadAttention):
        return ParallelAttention(layer, rank, world_size, counter)
    raise TypeError(f"layer must be an llmbook MLP or MultiHeadAttention, got {type(layer).__name__}")


def _check_x_grad_out(x: object, grad_out: object) -> None:
    """x (B, T, d) and the output gradient grad_out of the same shape and dtype (the layers map
    d to d): a mismatch would fail inside autograd's backward, on every rank."""
    check_finite(check_floating_tensor(x, "x"), "x")
    check_same_dtype(check_floating_tensor(grad_out, "grad_out"), "grad_out", x, "x")
    check_finite(grad_out, "grad_out")
    if grad_out.shape != x.shape:
        raise ValueError(f"grad_out must have the shape of the layer's output, that of x {tuple(x.shape)}, "
                         f"got {tuple(grad_out.shape)}")


def run_tensor_parallel_layer(rank: int, world_size: int, layer: nn.Module, x: Tensor,
                              grad_out: Tensor) -> dict[str, Any]:
    """Worker for :func:`llmbook.scale.launch.run`: shard ``layer``, run forward and backward.

    Every rank gets the whole single-process ``layer``, the input x (B, T, d) and the output
    gradient (B, T, d); it keeps its shard, computes y = layer(x) and backpropagates
    ``grad_out``. Returns ``{"out", "x_grad", "grads" (name -> (shard, split dim)), "calls"}``,
    ``calls`` being the :class:`CommCounter`'s records.
    """
    _check_x_grad_out(x, grad_out)
    counter = CommCounter()
    par = _parallel_layer(layer, rank, world_size, counter)
    x = x.detach().clone().requires_grad_(True)
    out = par(x)
    out.backward(grad_out)
    return {"out": out.detach(), "x_grad": x.grad, "grads": par.sharded_grads(),
            "calls": list(counter.calls)}


def run_tensor_parallel_layers(rank: int, world_size: int, layers: list[nn.Module], x: Tensor,
                               grad_out: Tensor) -> list[dict[str, Any]]:
    """:func:`run_tensor_parallel_layer` for several layers in one launch of the processes."""
    if not isinstance(layers, list | tuple) or not layers:
        raise TypeError(f"layers must be a non-empty list of layers, got {type(layers).__name__}")
    return [run_tensor_parallel_layer(rank, world_size, layer, x, grad_out) for layer in layers]


def single_process_reference(layer: nn.Module, x: Tensor,
                             grad_out: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The unsplit layer's output, input gradient and weight gradients (by state-dict name)."""
    if isinstance(layer, MultiHeadAttention):
        forward = lambda t: layer(t, is_causal=True)  # noqa: E731
    elif isinstance(layer, MLP):
        forward = layer
    else:
        raise TypeError(f"layer must be an llmbook MLP or MultiHeadAttention, got {type(layer).__name__}")
    _check_x_grad_out(x, grad_out)
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    out = forward(x)
    out.backward(grad_out)
    grads = {name: p.grad.detach().clone() for name, p in layer.named_parameters()}
    return out.detach(), x.grad, grads


def gather_sharded(results: list[dict[str, Any]]) -> dict[str, Tensor]:
    """Reassemble full gradients from the ranks' ``grads``: concatenate along the split
    dimension, in rank order; a replicated one (dim None) must be equal on every rank."""
    if not results:
        raise ValueError("gather_sharded needs the results of at least one rank")
    full: dict[str, Tensor] = {}
    for name, (_, dim) in results[0]["grads"].items():
        parts = [r["grads"][name][0] for r in results]
        if dim is None:
            if any(not torch.equal(parts[0], q) for q in parts[1:]):
                raise ValueError(f"replicated gradient {name!r} differs between ranks")
            full[name] = parts[0]
        else:
            full[name] = torch.cat(parts, dim=dim)
    return full
