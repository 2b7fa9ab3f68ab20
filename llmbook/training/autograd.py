"""A scalar reverse-mode automatic differentiation engine, a tiny MLP built on it, and a
finite-difference gradient checker.

Introduced in notebooks/08_backpropagation. Reverse-mode automatic differentiation
(Griewank & Walther, 2008, "Evaluating Derivatives", chapter 3) records a computation as a
directed acyclic graph whose nodes are intermediate values. Each node keeps its children
(the values it was computed from) and the *local* partial derivatives of itself with respect
to them, evaluated during the forward pass. The backward pass visits the nodes in reverse
topological order and applies the chain rule once per edge,

    child.grad += (d node / d child) * node.grad,

so every node's ``grad`` ends up as d(output) / d(node), with the contributions of all the
paths through a node that is used more than once summed. One backward pass costs a small
constant times the forward pass, whatever the number of inputs.

Contents:

* :class:`Value` - a float with a gradient: +, -, *, /, ** (constant exponent), exp, log,
  tanh, relu, sigmoid; Python numbers are accepted on either side;
* :func:`topological_order` - the nodes of a graph, children before parents, found
  iteratively (no recursion limit on deep graphs);
* :class:`Neuron`, :class:`Layer`, :class:`MLP`, :func:`mse_loss` - a multilayer perceptron
  of Values, initialised as ``torch.nn.Linear`` is, so that it can be compared with PyTorch;
* :func:`finite_difference` - forward and central difference quotients;
* :func:`numeric_gradient` - the central-difference gradient of a scalar function of
  tensors, with no autograd involved;
* :func:`gradcheck` - a float64 central-difference check of autograd gradients.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = [
    "MLP",
    "GradcheckError",
    "GradcheckResult",
    "Layer",
    "Neuron",
    "Value",
    "finite_difference",
    "gradcheck",
    "mse_loss",
    "numeric_gradient",
    "topological_order",
]


def _as_float(x: object, who: str) -> float:
    """x as a finite float, or a clear TypeError/ValueError."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{who}: expected a real number or a Value, got {x!r} "
                        f"({type(x).__name__})")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{who}: expected a finite number, got {x}")
    return x


class Value:
    """A scalar in a computation graph: its value ``data``, the gradient ``grad`` of the
    output with respect to it (filled in by :meth:`backward`), the ``children`` it was
    computed from, the local derivatives ``local_grads`` (d self / d child, one per child)
    and the name ``op`` of the operation that produced it (``""`` for a leaf).

    Arithmetic with Python numbers works on either side (``2 * x``, ``x + 1``, ``1 / x``);
    the number becomes a constant leaf. Anything else raises ``TypeError``. Values whose
    result is not a finite float raise instead of silently producing inf or NaN.
    """

    __slots__ = ("children", "data", "grad", "label", "local_grads", "op")

    def __init__(self, data: float, children: tuple[Value, ...] = (),
                 local_grads: tuple[float, ...] = (), op: str = "", label: str = "") -> None:
        self.data = _as_float(data, f"Value({op or 'leaf'})")
        if not all(math.isfinite(g) for g in local_grads):
            raise ValueError(f"Value({op}): the local derivative overflows float64 "
                             f"({local_grads}) at data = {self.data:.6g}")
        self.grad = 0.0
        self.children = children
        self.local_grads = local_grads
        self.op = op
        self.label = label

    def __repr__(self) -> str:
        name = f"{self.label}, " if self.label else ""
        return f"Value({name}data={self.data:.6g}, grad={self.grad:.6g})"

    @staticmethod
    def _lift(other: object, op: str) -> Value:
        """Turn a Python number into a constant leaf; pass Values through."""
        if isinstance(other, Value):
            return other
        return Value(_as_float(other, f"Value.{op}"))

    # ---------------------------------------------------------- binary operations

    def __add__(self, other: Value | float) -> Value:
        other = self._lift(other, "__add__")
        return Value(self.data + other.data, (self, other), (1.0, 1.0), "+")

    def __sub__(self, other: Value | float) -> Value:
        other = self._lift(other, "__sub__")
        return Value(self.data - other.data, (self, other), (1.0, -1.0), "-")

    def __mul__(self, other: Value | float) -> Value:
        other = self._lift(other, "__mul__")
        # d(ab)/da = b, d(ab)/db = a
        return Value(self.data * other.data, (self, other), (other.data, self.data), "*")

    def __truediv__(self, other: Value | float) -> Value:
        other = self._lift(other, "__truediv__")
        if other.data == 0.0:
            raise ZeroDivisionError(f"Value division by zero: {self.data:.6g} / 0")
        q = self.data / other.data
        # d(a/b)/da = 1/b, d(a/b)/db = -a/b^2 = -q/b
        return Value(q, (self, other), (1.0 / other.data, -q / other.data), "/")

    def __pow__(self, exponent: float) -> Value:
        if isinstance(exponent, Value):
            raise TypeError("Value ** Value is not supported: the exponent must be a constant "
                            "number; write (b * a.log()).exp() for a ** b with a > 0")
        n = _as_float(exponent, "Value.__pow__ exponent")
        if self.data == 0.0 and n < 0:
            raise ZeroDivisionError(f"Value: 0 ** {n:g} divides by zero")
        if self.data < 0 and not n.is_integer():
            raise ValueError(f"Value: a negative base to a non-integer power is not real: "
                             f"({self.data:.6g}) ** {n:g}")
        # d(a^n)/da = n a^(n-1); for n = 0 the derivative is 0 even at a = 0
        local = n * self.data ** (n - 1) if n != 0 else 0.0
        return Value(self.data**n, (self,), (local,), f"**{n:g}")

    def __rpow__(self, base: float) -> Value:
        c = _as_float(base, "Value.__rpow__ base")
        if c <= 0:
            raise ValueError(f"Value: c ** x needs a positive constant base c, got c = {c:g}")
        out = c**self.data
        return Value(out, (self,), (out * math.log(c),), f"{c:g}**")

    def __radd__(self, other: float) -> Value:
        return self._lift(other, "__radd__") + self

    def __rsub__(self, other: float) -> Value:
        return self._lift(other, "__rsub__") - self

    def __rmul__(self, other: float) -> Value:
        return self._lift(other, "__rmul__") * self

    def __rtruediv__(self, other: float) -> Value:
        return self._lift(other, "__rtruediv__") / self

    def __neg__(self) -> Value:
        return Value(-self.data, (self,), (-1.0,), "neg")

    # ---------------------------------------------------------- elementary functions

    def exp(self) -> Value:
        try:
            out = math.exp(self.data)
        except OverflowError:
            raise OverflowError(f"Value.exp overflows float64 at x = {self.data:.6g} "
                                f"(exp is finite only for x < 709.78)") from None
        return Value(out, (self,), (out,), "exp")  # d e^x / dx = e^x

    def log(self) -> Value:
        if self.data <= 0:
            raise ValueError(f"Value.log is defined for positive numbers only, got "
                             f"log({self.data:.6g})")
        return Value(math.log(self.data), (self,), (1.0 / self.data,), "log")

    def tanh(self) -> Value:
        t = math.tanh(self.data)
        return Value(t, (self,), (1.0 - t * t,), "tanh")  # tanh' = 1 - tanh^2

    def relu(self) -> Value:
        # the derivative at 0 is taken to be 0, as in PyTorch
        positive = self.data > 0
        return Value(self.data if positive else 0.0, (self,), (1.0 if positive else 0.0,), "relu")

    def sigmoid(self) -> Value:
        if self.data >= 0:  # never exponentiate a large positive number
            s = 1.0 / (1.0 + math.exp(-self.data))
        else:
            e = math.exp(self.data)
            s = e / (1.0 + e)
        return Value(s, (self,), (s * (1.0 - s),), "sigmoid")  # sigma' = sigma (1 - sigma)

    # ---------------------------------------------------------- reverse mode

    def backward(self) -> None:
        """Fill in ``grad`` = d self / d node for every node of the graph below ``self``.

        The nodes are visited in reverse topological order (each node after every node
        that uses it), and each passes its gradient to its children through the chain
        rule. As in PyTorch, the gradients of leaves *accumulate* over calls (zero them
        between steps), while those of intermediate nodes are recomputed from scratch.
        """
        order = topological_order(self)  # children before parents
        for node in order:
            if node.children:
                node.grad = 0.0
        self.grad += 1.0  # d self / d self
        for node in reversed(order):
            for child, local in zip(node.children, node.local_grads, strict=True):
                child.grad += local * node.grad


def topological_order(root: Value) -> list[Value]:
    """All nodes reachable from ``root``, each after all of its children (``root`` last).

    An iterative depth-first search with an explicit stack: a node is emitted when it is
    popped the second time, once all of its children have been emitted. A recursive
    version would fail on a chain deeper than Python's recursion limit (1000 by default).
    """
    if not isinstance(root, Value):
        raise TypeError(f"topological_order expects a Value, got {type(root).__name__}")
    order: list[Value] = []
    visited: set[int] = set()
    stack: list[tuple[Value, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))  # emitted after everything pushed below
        for child in node.children:
            if id(child) not in visited:
                stack.append((child, False))
    return order


# ---------------------------------------------------------------- a tiny MLP of Values

_ACTIVATIONS = ("tanh", "relu", "sigmoid", "linear")


class Neuron:
    """act(sum_i w_i x_i + b) for a list of ``n_in`` inputs.

    Weights and bias are drawn from U(-1/sqrt(n_in), 1/sqrt(n_in)), the distribution of
    ``torch.nn.Linear``'s default initialisation (Kaiming-uniform with a = sqrt(5)).
    """

    def __init__(self, n_in: int, activation: str = "tanh",
                 rng: random.Random | None = None) -> None:
        if isinstance(n_in, bool) or not isinstance(n_in, int) or n_in <= 0:
            raise ValueError(f"n_in must be a positive int, got {n_in!r}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
        rng = rng or random.Random(0)
        bound = 1.0 / math.sqrt(n_in)
        self.w = [Value(rng.uniform(-bound, bound)) for _ in range(n_in)]
        self.b = Value(rng.uniform(-bound, bound))
        self.activation = activation

    def __call__(self, x: Sequence[Value | float]) -> Value:
        if len(x) != len(self.w):
            raise ValueError(f"Neuron expects {len(self.w)} inputs, got {len(x)}")
        z = self.b
        for w_i, x_i in zip(self.w, x, strict=True):
            z = z + w_i * x_i
        return z if self.activation == "linear" else getattr(z, self.activation)()

    def parameters(self) -> list[Value]:
        return [*self.w, self.b]


class Layer:
    """``n_out`` neurons reading the same ``n_in`` inputs: (n_in,) -> (n_out,)."""

    def __init__(self, n_in: int, n_out: int, activation: str = "tanh",
                 rng: random.Random | None = None) -> None:
        if isinstance(n_out, bool) or not isinstance(n_out, int) or n_out <= 0:
            raise ValueError(f"n_out must be a positive int, got {n_out!r}")
        rng = rng or random.Random(0)
        self.neurons = [Neuron(n_in, activation, rng) for _ in range(n_out)]

    def __call__(self, x: Sequence[Value | float]) -> list[Value]:
        return [n(x) for n in self.neurons]

    def parameters(self) -> list[Value]:
        return [p for n in self.neurons for p in n.parameters()]


class MLP:
    """A multilayer perceptron of Values: sizes = [n_in, h_1, ..., n_out].

    Hidden layers use ``activation``; the last layer is linear. ``seed`` fixes the
    initialisation. Calling it on a list of n_in numbers returns a list of n_out Values.
    :meth:`weights` exports the parameters as (W, b) pairs in ``torch.nn.Linear``'s layout,
    W of shape (n_out, n_in), so that the same network can be built in PyTorch.
    """

    def __init__(self, sizes: Sequence[int], activation: str = "tanh", seed: int = 0) -> None:
        if len(sizes) < 2:
            raise ValueError(f"sizes must list at least an input and an output size, got {sizes}")
        rng = random.Random(seed)
        n_layers = len(sizes) - 1
        self.sizes = list(sizes)
        self.layers = [Layer(sizes[i], sizes[i + 1], activation if i < n_layers - 1 else "linear",
                             rng) for i in range(n_layers)]

    def __call__(self, x: Sequence[Value | float]) -> list[Value]:
        h: Sequence[Value | float] = x
        for layer in self.layers:
            h = layer(h)
        return list(h)

    def parameters(self) -> list[Value]:
        return [p for layer in self.layers for p in layer.parameters()]

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = 0.0

    def weights(self) -> list[tuple[list[list[float]], list[float]]]:
        """[(W, b)] per layer: W[j][i] is neuron j's weight on input i; b[j] its bias."""
        return [([[w.data for w in n.w] for n in layer.neurons], [n.b.data for n in layer.neurons])
                for layer in self.layers]

    def gradients(self) -> list[tuple[list[list[float]], list[float]]]:
        """[(dL/dW, dL/db)] per layer, in the layout of :meth:`weights`."""
        return [([[w.grad for w in n.w] for n in layer.neurons], [n.b.grad for n in layer.neurons])
                for layer in self.layers]


def mse_loss(predictions: Iterable[Value], targets: Iterable[float]) -> Value:
    """The mean squared error (1/N) sum_n (prediction_n - target_n)^2 as a Value."""
    predictions, targets = list(predictions), list(targets)
    if len(predictions) != len(targets) or not predictions:
        raise ValueError(f"mse_loss needs as many targets as predictions (and at least one), "
                         f"got {len(predictions)} predictions and {len(targets)} targets")
    total = sum(((p - t) ** 2 for p, t in zip(predictions, targets, strict=True)), Value(0.0))
    return total / len(predictions)


# ---------------------------------------------------------------- finite differences


def finite_difference(f: Callable[[Tensor], Tensor], x: Tensor, eps: float,
                      scheme: str = "central") -> Tensor:
    """Difference quotients of an elementwise function f at x, in x's dtype.

    * ``"forward"``: (f(x + eps) - f(x)) / eps, truncation error (eps/2) |f''|;
    * ``"central"``: (f(x + eps) - f(x - eps)) / (2 eps), truncation error (eps^2/6) |f'''|.

    Both suffer a round-off error of order u |f| / eps (u the unit round-off of the dtype),
    which is why eps can be too small as well as too large.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"finite_difference expects a floating-point tensor x, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if not (isinstance(eps, numbers.Real) and eps > 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    h = torch.tensor(eps, dtype=x.dtype)
    if scheme == "forward":
        return (f(x + h) - f(x)) / h
    if scheme == "central":
        return (f(x + h) - f(x - h)) / (2 * h)
    raise ValueError(f"scheme must be 'forward' or 'central', got {scheme!r}")


class GradcheckError(AssertionError):
    """Raised by :func:`gradcheck` with ``raise_exception=True`` when gradients disagree."""


@dataclass(frozen=True)
class GradcheckResult:
    """The verdict of :func:`gradcheck`: true when every entry passed.

    ``max_abs_error`` is max |analytic - numeric| over all entries, ``worst`` names the
    (input index, element index) where the tolerance was exceeded most, ``analytic`` and
    ``numeric`` are the two gradients (one tensor per input).
    """

    passed: bool
    max_abs_error: float
    worst: tuple[int, tuple[int, ...]]
    analytic: tuple[Tensor, ...] = field(repr=False)
    numeric: tuple[Tensor, ...] = field(repr=False)
    atol: float
    rtol: float

    def __bool__(self) -> bool:
        return self.passed

    def report(self) -> str:
        i, idx = self.worst
        a, n = self.analytic[i][idx].item(), self.numeric[i][idx].item()
        verdict = "passed" if self.passed else "FAILED"
        return (f"gradcheck {verdict}: max |analytic - numeric| = {self.max_abs_error:.3g}; "
                f"worst entry: input {i} at {idx}, analytic {a:.10g} vs numeric {n:.10g} "
                f"(tolerance atol + rtol |numeric| with atol = {self.atol:g}, "
                f"rtol = {self.rtol:g})")


def _unravel(k: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The multi-index of flat (row-major) position k in a tensor of the given shape."""
    index = []
    for n in reversed(shape):
        k, r = divmod(k, n)
        index.append(r)
    return tuple(reversed(index))


def numeric_gradient(f: Callable[..., Tensor | float], inputs: Tensor | Sequence[Tensor],
                     eps: float = 1e-6) -> tuple[Tensor, ...]:
    """Central-difference gradient of a scalar function of tensors, entry by entry.

    ``f(*inputs)`` returns a scalar (a one-element tensor or a float); for every entry x_i
    of every input the result holds (f(x + eps e_i) - f(x - eps e_i)) / (2 eps), with the
    input's shape (one tensor per input). No autograd is involved, so this is an
    independent witness for any analytic gradient; its error is about
    (eps^2 / 6) |f^(3)| + u |f| / eps (section 8.9 of notebooks/08_backpropagation).
    The inputs are copied, never changed; they must be floating-point tensors.
    """
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    if not inputs:
        raise ValueError("numeric_gradient needs at least one input tensor")
    for i, x in enumerate(inputs):
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"numeric_gradient: input {i} must be a floating-point tensor, got "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
    if isinstance(eps, bool) or not (isinstance(eps, numbers.Real) and eps > 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    numeric = []
    base = [x.detach().clone(memory_format=torch.contiguous_format) for x in inputs]
    for x in base:
        num = torch.zeros_like(x)
        flat, num_flat = x.view(-1), num.view(-1)
        for j in range(flat.numel()):
            old = flat[j].item()
            flat[j] = old + eps
            plus = float(f(*base))
            flat[j] = old - eps
            minus = float(f(*base))
            flat[j] = old
            num_flat[j] = (plus - minus) / (2 * eps)
        numeric.append(num)
    return tuple(numeric)


def gradcheck(f: Callable[..., Tensor], inputs: Tensor | Sequence[Tensor], eps: float = 1e-6,
              atol: float = 1e-5, rtol: float = 1e-3, seed: int = 0,
              raise_exception: bool = False) -> GradcheckResult:
    """Compare autograd's gradient of f with central differences, entry by entry.

    ``f(*inputs)`` returns a tensor. If it has more than one element it is reduced to the
    scalar <v, f(inputs)> with a fixed random v (uniform in [-1, 1), from ``seed``): a random
    projection, which checks the vector-Jacobian product J^T v, what backpropagation
    computes. Each input
    entry x_i is perturbed by +-eps and the numeric derivative
    (s(x + eps e_i) - s(x - eps e_i)) / (2 eps) compared with the analytic one; the entry
    passes when |analytic - numeric| <= atol + rtol |numeric| (the defaults are
    ``torch.autograd.gradcheck``'s).

    Inputs must be float64: the round-off of a central difference is about u |f| / eps,
    which for float32 (u = 6e-8) and eps = 1e-6 is 0.06, larger than any useful tolerance.
    Returns a :class:`GradcheckResult` (truthy when it passed; ``.report()`` explains);
    with ``raise_exception=True`` a failure raises :class:`GradcheckError` instead.
    """
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    if not inputs:
        raise ValueError("gradcheck needs at least one input tensor")
    for i, x in enumerate(inputs):
        if not isinstance(x, Tensor):
            raise TypeError(f"gradcheck: input {i} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.float64:
            raise TypeError(
                f"gradcheck: input {i} has dtype {x.dtype}; finite differences need float64. "
                f"Their round-off error is about u|f|/eps (u = unit round-off: 6e-8 in float32, "
                f"1.1e-16 in float64), so in float32 it would swamp the gradient at any eps "
                f"small enough to keep the truncation error down")
    if not (isinstance(eps, numbers.Real) and eps > 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = f(*xs)
    if not isinstance(out, Tensor) or out.dtype != torch.float64:
        raise TypeError(f"gradcheck: f must return a float64 tensor, got "
                        f"{getattr(out, 'dtype', type(out).__name__)}")
    # v uniform in [-1, 1): a generic direction (drawn from another law than torch.randn, so
    # that it cannot coincide with inputs made by torch.randn from the same seed)
    v = 2 * torch.rand(out.shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64) - 1
    analytic = torch.autograd.grad((v * out).sum(), xs, allow_unused=True)
    analytic = tuple(torch.zeros_like(x) if a is None else a.detach()
                     for a, x in zip(analytic, xs, strict=True))

    def projected(*args: Tensor) -> float:
        with torch.no_grad():
            return float((v * f(*args)).sum())

    numeric = numeric_gradient(projected, inputs, eps)

    passed, max_err, worst, worst_excess = True, 0.0, (0, (0,) * inputs[0].ndim), -math.inf
    for i, (a, n) in enumerate(zip(analytic, numeric, strict=True)):
        if a.numel() == 0:
            continue
        err = (a - n).abs()
        excess = err - (atol + rtol * n.abs())
        max_err = max(max_err, float(err.max()))
        k = int(excess.argmax())
        if float(excess.reshape(-1)[k]) > worst_excess:
            worst_excess = float(excess.reshape(-1)[k])
            worst = (i, _unravel(k, tuple(a.shape)))
        passed = passed and bool((excess <= 0).all())
    result = GradcheckResult(passed, max_err, worst, analytic, tuple(numeric), atol, rtol)
    if raise_exception and not passed:
        raise GradcheckError(result.report())
    return result
