"""Reference solutions to the exercises of notebooks/08_backpropagation (checked by
tests/test_solutions_08.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import sympy as sp
import torch

from llmbook.training.autograd import MLP, Value

# ---------------------------------------------------------------- exercise 1


def softplus(x: Value) -> Value:
    """Exercise 1: log(1 + e^x) from Value operations, finite for any finite x.

    For x > 0 use the identity log(1 + e^x) = x + log(1 + e^-x), so that exp only ever sees
    a non-positive argument (e^-800 underflows harmlessly to 0; e^800 would overflow). Both
    branches have the derivative sigma(x): 1 - e^-x / (1 + e^-x) and e^x / (1 + e^x).
    """
    if x.data > 0:
        return x + (1 + (-x).exp()).log()
    return (1 + x.exp()).log()


# ---------------------------------------------------------------- exercise 2


def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, eps: float,
                      grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 2: gradients of y = w * x / r, r = sqrt(mean(x^2) + eps).

    The Jacobian is diag(w) (I - x x^T / (d r^2)) / r (chapter 6), so with x_hat = x / r and
    g' = w * G, J^T G = (g' - x_hat mean(g' * x_hat)) / r; dL/dw = sum over positions of
    G * x_hat. Shapes: x, grad_out (..., d); weight (d,) -> ((..., d), (d,)).
    """
    d = x.shape[-1]
    r = (x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (..., 1)
    x_hat = x / r  # (..., d)
    g = weight * grad_out  # (..., d)
    grad_x = (g - x_hat * (g * x_hat).mean(dim=-1, keepdim=True)) / r
    grad_w = (grad_out * x_hat).reshape(-1, d).sum(dim=0)
    return grad_x, grad_w


# ---------------------------------------------------------------- exercise 3


def five_point_coefficients() -> list[sp.Rational]:
    """Exercise 3: c_{-2..2} with f'(x) = (1/eps) sum_k c_k f(x + k eps) + O(eps^4).

    Expanding f(x + k eps) = sum_m f^(m)(x) (k eps)^m / m!, the weights must satisfy
    sum_k c_k k^m = [m == 1] for m = 0..4: five linear equations for five unknowns.
    Result: (1/12, -2/3, 0, 2/3, -1/12).
    """
    c = sp.symbols("c_0:5")
    ks = range(-2, 3)
    eqs = [sp.Eq(sum(ci * k**m for ci, k in zip(c, ks, strict=True)), 1 if m == 1 else 0)
           for m in range(5)]
    sol = sp.solve(eqs, c)
    return [sol[ci] for ci in c]


def five_point_truncation_constant() -> sp.Rational:
    """The error of the stencil is -(eps^4 / 30) f^(5)(x) + O(eps^6): returns 1/30.

    Found by expanding sum_k c_k f(x + k eps) / eps for f = exp(t) at t = 0 symbolically.
    """
    eps, t = sp.symbols("varepsilon t", positive=True)
    cs = five_point_coefficients()
    stencil = sum(c * sp.exp(t + k * eps) for c, k in zip(cs, range(-2, 3), strict=True)) / eps
    series = sp.series(stencil.subs(t, 0), eps, 0, 6).removeO()
    return sp.nsimplify(-(series - 1).coeff(eps, 4))


def five_point_derivative(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                          eps: float) -> torch.Tensor:
    """The five-point estimate of f'(x), in x's dtype."""
    h = torch.tensor(eps, dtype=x.dtype)
    cs = [float(c) for c in five_point_coefficients()]
    return sum(c * f(x + k * h) for c, k in zip(cs, range(-2, 3), strict=True) if c != 0) / h


def predicted_five_point_optimum(u: float) -> tuple[float, float]:
    """(optimal eps, error there) for f = exp from E = a eps^4 + b / eps.

    a = |f^(5)| / 30 and b = u |f| sum_k |c_k| = 1.5 u |f|; with f = f^(5), relative errors
    use f = 1. Minimum at eps* = (b / (4 a))^(1/5), where E = (5/4) b / eps*.
    """
    eps, a, b = sp.symbols("varepsilon a b", positive=True)
    E = a * eps**4 + b / eps
    (eps_star,) = sp.solve(sp.diff(E, eps), eps)
    vals = {a: five_point_truncation_constant(),
            b: sum(abs(c) for c in five_point_coefficients()) * sp.Float(u)}
    return float(eps_star.subs(vals)), float(E.subs(eps, eps_star).subs(vals))


def measured_five_point_optimum(eps_grid: Sequence[float]) -> tuple[float, float]:
    """(best eps, its median relative error) for exp on 101 points of [0.5, 1.5], float64."""
    x = torch.linspace(0.5, 1.5, 101, dtype=torch.float64)
    errors = [((five_point_derivative(torch.exp, x, e) - x.exp()).abs() / x.exp()).median().item()
              for e in eps_grid]
    i = min(range(len(errors)), key=errors.__getitem__)
    return float(eps_grid[i]), errors[i]


# ---------------------------------------------------------------- exercise 4


class Dual:
    """A dual number a + a' e with e^2 = 0: ``value`` carries f, ``tangent`` carries the
    directional derivative. Each operation applies the chain rule forwards."""

    __slots__ = ("tangent", "value")

    def __init__(self, value: float, tangent: float = 0.0) -> None:
        self.value = float(value)
        self.tangent = float(tangent)

    @staticmethod
    def _lift(other: Dual | float) -> Dual:
        return other if isinstance(other, Dual) else Dual(other)

    def __add__(self, other: Dual | float) -> Dual:
        o = self._lift(other)
        return Dual(self.value + o.value, self.tangent + o.tangent)

    __radd__ = __add__

    def __neg__(self) -> Dual:
        return Dual(-self.value, -self.tangent)

    def __sub__(self, other: Dual | float) -> Dual:
        return self + (-self._lift(other))

    def __rsub__(self, other: float) -> Dual:
        return self._lift(other) - self

    def __mul__(self, other: Dual | float) -> Dual:
        o = self._lift(other)
        return Dual(self.value * o.value, self.tangent * o.value + self.value * o.tangent)

    __rmul__ = __mul__

    def __truediv__(self, other: Dual | float) -> Dual:
        o = self._lift(other)
        q = self.value / o.value
        return Dual(q, (self.tangent - q * o.tangent) / o.value)

    def __pow__(self, n: float) -> Dual:
        return Dual(self.value**n, n * self.value ** (n - 1) * self.tangent)

    def tanh(self) -> Dual:
        t = math.tanh(self.value)
        return Dual(t, (1 - t * t) * self.tangent)

    def exp(self) -> Dual:
        e = math.exp(self.value)
        return Dual(e, e * self.tangent)


def _tanh(z):
    """tanh of a plain number, a Dual or a Value."""
    return math.tanh(z) if isinstance(z, int | float) else z.tanh()


def mlp_mse(params: Sequence, sizes: Sequence[int], X: Sequence[Sequence[float]],
            y: Sequence[float]):
    """The mean squared error of a tanh MLP (last layer linear) for any number type.

    ``params`` lists the parameters in the order of ``llmbook.training.autograd.MLP.parameters()``:
    layer by layer, neuron by neuron, the n_in weights then the bias.
    """
    loss = 0.0
    for row, target in zip(X, y, strict=True):
        h, i = list(row), 0
        for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            out = []
            for _ in range(n_out):
                z = params[i + n_in]  # the bias
                for w, x in zip(params[i:i + n_in], h, strict=True):
                    z = z + w * x
                i += n_in + 1
                out.append(_tanh(z) if layer < len(sizes) - 2 else z)
            h = out
        loss = loss + (h[0] - target) ** 2
    return loss / len(y)


def forward_mode_gradient(mlp: MLP, X: Sequence[Sequence[float]],
                          y: Sequence[float]) -> tuple[list[float], int]:
    """Exercise 4: the gradient of the MLP's loss by forward mode, one pass per parameter.

    Returns (gradient in parameter order, number of forward passes). Reverse mode
    (``Value.backward``) needs one forward and one backward pass for all of it.
    """
    values = [p.data for p in mlp.parameters()]
    grad, passes = [], 0
    for j in range(len(values)):
        duals = [Dual(v, 1.0 if i == j else 0.0) for i, v in enumerate(values)]
        grad.append(mlp_mse(duals, mlp.sizes, X, y).tangent)
        passes += 1
    return grad, passes


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
