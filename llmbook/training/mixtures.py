"""Data mixtures: sampling sources by temperature, epochs per source, the data-mixing law.

Introduced in notebooks/10d_data_mixtures. A pretraining corpus is a mixture of
sources (web pages, books, code, papers) of very different sizes n_i, and the run draws
its D training tokens from source i with probability p_i. The pieces:

* :func:`temperature_weights`: p_i proportional to n_i^alpha (alpha = 1: as large as the
  source is; alpha -> 0: uniform), the "temperature sampling" of multilingual models
  (Conneau et al., 2020, use alpha = 0.3; Arivazhagan et al., 2019, write T = 1/alpha);
* :func:`epochs_per_source`: e_i = p_i D / n_i, the passes over source i a run makes:
  up-weighting a small source means repeating it;
* :func:`sample_sources` and :func:`mixture_batch`: a seeded sampler that picks each
  window's source with probability p_i, then a window within it;
* :func:`mixing_law`, :func:`fit_mixing_law`: the exponential data-mixing law of Ye et
  al. (2024, "Data Mixing Laws", arXiv 2403.16952, their equation 6),
  L_i(r) = c_i + k_i exp(sum_j t_ij r_j), fitted per target source i by
  Levenberg-Marquardt in float64;
* :data:`PUBLISHED_MIXTURES`: the mixtures of GPT-3 (Brown et al., 2020, Table 2.2),
  LLaMA (Touvron et al., 2023, Table 1) and the Pile (Gao et al., 2020, Table 1), with
  :func:`category_shares` to sum them into broad categories.

Imports Parts I–II and :mod:`llmbook.training.train`, never a later part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from llmbook.paths import data_path, missing_data
from llmbook.text.data import MarkovSource
from llmbook.training.optim import AdamW, cosine_schedule
from llmbook.training.train import TrainConfig, _check_tokens, get_batch, param_groups, train_step
from llmbook.validation import check_array

__all__ = [
    "PUBLISHED_MIXTURES",
    "MixingLawFit",
    "book_sources",
    "category_shares",
    "epochs_per_source",
    "fit_mixing_law",
    "mixing_law",
    "mixture_batch",
    "sample_sources",
    "synthetic_mixture_source",
    "total_variation",
    "temperature_weights",
    "train_on_mixture",
]


# ---------------------------------------------------------------- validation


def _vector(name: str, values: object, positive: bool = False) -> np.ndarray:
    """A 1-D, finite, non-negative (or positive) float64 array, or an error naming ``name``."""
    return check_array(name, values, ndim=1, sign="positive" if positive else "nonnegative")


def _distribution(name: str, weights: object) -> np.ndarray:
    """Check non-negative weights with a positive sum; return them normalised to sum 1."""
    w = _vector(name, weights)
    if w.sum() <= 0:
        raise ValueError(f"{name} must have a positive sum, got {w.tolist()}")
    return w / w.sum()


# ---------------------------------------------------------------- temperature and epochs


def temperature_weights(sizes: Sequence[float] | np.ndarray, alpha: float) -> np.ndarray:
    """Sampling probabilities p_i = n_i^alpha / sum_j n_j^alpha, shape ``(K,)`` float64.

    ``sizes`` are the K sources' sizes n_i (tokens, or bytes: only ratios matter).
    ``alpha = 1`` samples in proportion to size (every token equally often);
    ``alpha = 0`` samples the sources uniformly; in between, small sources are
    up-weighted. (With the temperature T = 1/alpha of Arivazhagan et al., 2019.)
    Computed in log space, so sizes of 10^12 tokens do not overflow.
    """
    n = _vector("sizes", sizes, positive=True)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha) \
            or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got alpha={alpha!r}")
    logits = alpha * np.log(n)
    p = np.exp(logits - logits.max())
    return p / p.sum()


def epochs_per_source(weights: Sequence[float] | np.ndarray, sizes: Sequence[float] | np.ndarray,
                      budget: float) -> np.ndarray:
    """Passes over each source, e_i = p_i D / n_i, shape ``(K,)`` float64.

    ``weights`` p (normalised here to sum 1), ``sizes`` n_i and the token ``budget`` D
    in the same unit. A source with e_i > 1 is repeated; p_i = n_i / sum n gives every
    source the same e = D / sum n.
    """
    p = _distribution("weights", weights)
    n = _vector("sizes", sizes, positive=True)
    if p.shape != n.shape:
        raise ValueError(f"weights and sizes must have the same length, got {p.size} and {n.size}")
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not math.isfinite(budget) \
            or budget <= 0:
        raise ValueError(f"budget must be a positive number of tokens, got budget={budget!r}")
    return p * float(budget) / n


# ---------------------------------------------------------------- the sampler


def sample_sources(weights: Sequence[float] | np.ndarray, num_draws: int,
                   generator: torch.Generator | None = None) -> Tensor:
    """``num_draws`` independent source indices, each i with probability p_i: ``(num_draws,)`` long.

    ``torch.multinomial`` with replacement over the normalised ``weights``, seeded by
    ``generator``; the counts are multinomial(num_draws, p), so each count has mean
    num_draws p_i and variance num_draws p_i (1 - p_i).
    """
    p = _distribution("weights", weights)
    if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws <= 0:
        raise ValueError(f"num_draws must be a positive int, got num_draws={num_draws!r}")
    probs = torch.from_numpy(p)
    return torch.multinomial(probs, num_draws, replacement=True, generator=generator)


def mixture_batch(sources: Sequence[np.ndarray | Tensor], weights: Sequence[float] | np.ndarray,
                  batch_size: int, context_length: int,
                  generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of B windows, each from source i with probability p_i.

    First the B sources are drawn (:func:`sample_sources`), then for each source in turn
    its windows (:func:`llmbook.training.train.get_batch` on that source's tokens), all
    from ``generator``; rows keep the order of the draws.

    Args:
        sources: K token arrays, each ``(n_i,)`` integer ids of one shared vocabulary,
            longer than ``context_length``.
        weights: ``(K,)`` mixture weights p (normalised here).
        batch_size: B. context_length: T.
        generator: a ``torch.Generator`` (None: torch's global one).

    Returns:
        ``(x, y, source)``: inputs and next-token targets ``(B, T)`` long, and the
        source index of each row ``(B,)`` long.
    """
    if not isinstance(sources, Sequence) or isinstance(sources, str | bytes) or not sources:
        raise TypeError(f"sources must be a non-empty sequence of token arrays, got "
                        f"{type(sources).__name__}")
    for i, tokens in enumerate(sources):
        n = _check_tokens(tokens, f"sources[{i}]")
        if n <= context_length:
            raise ValueError(f"sources[{i}] has {n} tokens, not more than context_length="
                             f"{context_length}")
    p = _distribution("weights", weights)
    if p.size != len(sources):
        raise ValueError(f"weights has {p.size} entries for {len(sources)} sources")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got batch_size={batch_size!r}")
    source = sample_sources(p, batch_size, generator)  # (B,)
    x = torch.empty(batch_size, context_length, dtype=torch.long)
    y = torch.empty(batch_size, context_length, dtype=torch.long)
    for i, tokens in enumerate(sources):
        rows = (source == i).nonzero().flatten()  # the rows drawn from source i
        if rows.numel():
            x[rows], y[rows] = get_batch(tokens, rows.numel(), context_length, "cpu", generator)
    return x, y, source


def train_on_mixture(model: torch.nn.Module, sources: Sequence[np.ndarray | Tensor],
                     weights: Sequence[float] | np.ndarray, config: TrainConfig,
                     stop_at: int | None = None) -> list[float]:
    """Train ``model`` for ``config.steps`` steps on batches of the mixture; return the train losses.

    The loop of :func:`llmbook.training.train.train` (AdamW with decay on the matrices,
    warmup + cosine schedule, clipping) with :func:`mixture_batch` as the batch
    sampler, seeded by ``config.seed``; no evaluation, no checkpoints. Each window is
    one draw, so the expected share of source i in the run's B T steps tokens is p_i.
    ``stop_at`` ends the loop after that many steps (the schedule still runs to
    ``config.steps``), so the first steps of a long run can be replayed.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    c = config
    end = c.steps
    if stop_at is not None:
        if isinstance(stop_at, bool) or not isinstance(stop_at, int) or stop_at <= 0:
            raise ValueError(f"stop_at must be a positive int or None, got stop_at={stop_at!r}")
        end = min(stop_at, c.steps)
    optimizer = AdamW(param_groups(model, c.weight_decay), lr=c.lr, betas=c.betas,
                      weight_decay=c.weight_decay)
    generator = torch.Generator().manual_seed(c.seed)
    model.train()
    losses = []
    for step in range(end):
        lr = cosine_schedule(step, c.lr, c.min_lr, c.warmup_steps, c.steps)
        x, y, _ = mixture_batch(sources, weights, c.batch_size, c.context_length, generator)
        loss, _ = train_step(model, optimizer, x, y, lr, c.grad_clip)
        losses.append(float(loss))
    model.eval()
    return losses


#: The synthetic source's symbols follow the 256 byte values in the shared vocabulary.
SYNTHETIC_OFFSET = 256


def synthetic_mixture_source() -> MarkovSource:
    """The synthetic source of the mixtures: ``MarkovSource(16, order=1, concentration=0.2, seed=0)``.

    Its entropy rate (1.7744 nats/token) is the floor of its validation loss; its
    unigram entropy (2.6806) is what a model that ignores the previous token reaches.
    """
    return MarkovSource(vocab_size=16, order=1, concentration=0.2, seed=0)


def book_sources(num_synthetic: int = 200_000, val_fraction: float = 0.1,
                 seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The book's three sources in one vocabulary of 256 bytes + 16 symbols (V = 272).

    * ``"synthetic"``: an order-1 Markov chain of chapter 3's kind
      (:func:`synthetic_mixture_source`: V = 16, concentration 0.2, seed 0; order 1, not
      the default source's 2, so that a run of a few hundred steps can learn it),
      ``num_synthetic`` tokens from ``seed``, its symbols shifted to 256..271;
    * ``"prose"``: the book's own English prose (``data/heldout_prose.txt``, about 27 KB),
      as UTF-8 bytes: the small source;
    * ``"docs"``: the standard library's docstrings (``data/stdlib_docs.txt``, about
      1.3 MB), as UTF-8 bytes: the large one.

    Each is split at ``1 - val_fraction`` of its length into ``(train, val)`` ``uint16``
    arrays: the held-out tail is never trained on.
    """
    from llmbook.text.corpus import load_stdlib_docs

    if isinstance(num_synthetic, bool) or not isinstance(num_synthetic, int) or num_synthetic < 1000:
        raise ValueError(f"num_synthetic must be an int >= 1000, got {num_synthetic!r}")
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, float) \
            or not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be a float in (0, 1), got {val_fraction!r}")
    prose_path = data_path("heldout_prose.txt")
    if not prose_path.is_file():
        raise missing_data(prose_path, "the held-out prose", "python data/make_heldout_prose.py")
    synthetic = synthetic_mixture_source().sample(num_synthetic, seed=seed).numpy() + SYNTHETIC_OFFSET
    raw = {"synthetic": synthetic,
           "prose": np.frombuffer(prose_path.read_bytes(), dtype=np.uint8),
           "docs": np.frombuffer(load_stdlib_docs().encode("utf-8"), dtype=np.uint8)}
    out = {}
    for name, ids in raw.items():
        cut = int(len(ids) * (1 - val_fraction))
        ids = ids.astype(np.uint16)
        out[name] = (ids[:cut], ids[cut:])
    return out


# ---------------------------------------------------------------- the data-mixing law


def mixing_law(r: np.ndarray | Sequence[Sequence[float]], c: np.ndarray, k: np.ndarray,
               t: np.ndarray) -> np.ndarray:
    """The exponential data-mixing law of Ye et al. (2024, eq. 6) at M mixtures.

    L_i(r) = c_i + k_i exp(sum_j t_ij r_j) for each target i of S.

    Args:
        r: ``(M, K)`` mixture proportions (rows usually on the simplex).
        c: ``(S,)`` irreducible losses. k: ``(S,)`` scales. t: ``(S, K)`` rates.

    Returns:
        ``(M, S)`` predicted losses, float64.
    """
    r = np.asarray(r, dtype=np.float64)
    c, k, t = (np.asarray(a, dtype=np.float64) for a in (c, k, t))
    if r.ndim != 2:
        raise ValueError(f"r must be (M, K), got shape {r.shape}")
    if c.ndim != 1 or k.shape != c.shape or t.shape != (c.size, r.shape[1]):
        raise ValueError(f"need c (S,), k (S,), t (S, K={r.shape[1]}); got c {c.shape}, "
                         f"k {k.shape}, t {t.shape}")
    return c[None, :] + k[None, :] * np.exp(r @ t.T)  # (M, S)


@dataclass(frozen=True)
class MixingLawFit:
    """A fitted mixing law: ``c`` (S,), ``k`` (S,), ``t`` (S, K); ``rmse`` (S,) on the fit data.

    On the simplex (sum_j r_j = 1) only k_i exp(t_ij) and the differences between the
    t_ij of one row are determined: adding s to every t_ij and dividing k_i by e^s gives
    the same law. The fit returns the member of that family that the damped steps reach;
    its predictions, not its raw parameters, are what the data pin down.
    """

    c: np.ndarray
    k: np.ndarray
    t: np.ndarray
    rmse: np.ndarray

    def predict(self, r: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
        """Predicted losses ``(M, S)`` at mixtures ``r`` ``(M, K)``."""
        return mixing_law(r, self.c, self.k, self.t)


def _levenberg_marquardt(r: np.ndarray, y: np.ndarray, theta: np.ndarray,
                         iterations: int) -> tuple[np.ndarray, float]:
    """Minimise sum (c + exp(b + r t) - y)^2 over theta = (c, b, t_1..t_K) from ``theta``."""
    design = np.hstack([np.ones((r.shape[0], 1)), r])  # (M, 1 + K): d(b + r t)/d(b, t)

    def residual(th: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e = np.exp(np.clip(th[1] + r @ th[2:], -700, 700))  # (M,)
        return th[0] + e - y, e

    res, e = residual(theta)
    cost, lam = float(res @ res), 1e-3
    for _ in range(iterations):
        jac = np.hstack([np.ones((r.shape[0], 1)), e[:, None] * design])  # (M, 2 + K)
        jtj, jtr = jac.T @ jac, jac.T @ res
        improved = False
        while lam < 1e12:
            step = np.linalg.solve(jtj + lam * np.eye(jtj.shape[0]), -jtr)
            new_res, new_e = residual(theta + step)
            new_cost = float(new_res @ new_res)
            if np.isfinite(new_cost) and new_cost < cost:
                theta, res, e = theta + step, new_res, new_e
                converged = cost - new_cost <= 1e-15 * max(cost, 1e-300)
                cost, lam, improved = new_cost, max(lam / 10, 1e-12), True
                break
            lam *= 10
        if not improved or converged:
            break
    return theta, cost


def fit_mixing_law(r: np.ndarray | Sequence[Sequence[float]],
                   losses: np.ndarray | Sequence[Sequence[float]],
                   iterations: int = 500) -> MixingLawFit:
    """Fit L_i(r) = c_i + k_i exp(sum_j t_ij r_j) to measured losses, one target i at a time.

    Least squares in the losses, by Levenberg–Marquardt in float64 (k_i = e^{b_i} > 0),
    started from a grid of offsets c below the smallest loss: for a fixed c the law is
    linear in log(L - c), so b and t start from that linear least-squares solution
    (the minimum-norm one, which on the simplex picks a member of the family of
    equivalent parameters). The best of the starts wins.

    Args:
        r: ``(M, K)`` mixture proportions of the M training runs.
        losses: ``(M, S)`` measured losses, one column per target source.
        iterations: the most Levenberg–Marquardt steps per start.

    Returns:
        :class:`MixingLawFit` with ``c`` (S,), ``k`` (S,), ``t`` (S, K), ``rmse`` (S,).
    """
    r = np.asarray(r, dtype=np.float64)
    y_all = np.asarray(losses, dtype=np.float64)
    if r.ndim != 2 or y_all.ndim != 2 or r.shape[0] != y_all.shape[0]:
        raise ValueError(f"r must be (M, K) and losses (M, S) with the same M, got r {r.shape} "
                         f"and losses {y_all.shape}")
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(y_all))):
        raise ValueError("r and losses must be finite")
    if r.shape[0] < 3:
        raise ValueError(f"need at least 3 mixtures to fit, got M={r.shape[0]}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations <= 0:
        raise ValueError(f"iterations must be a positive int, got iterations={iterations!r}")
    design = np.hstack([np.ones((r.shape[0], 1)), r])  # (M, 1 + K)
    cs, ks, ts, rmses = [], [], [], []
    for i in range(y_all.shape[1]):
        y = y_all[:, i]
        span = max(float(y.max() - y.min()), 1e-3 * max(abs(float(y.min())), 1.0))
        best: tuple[float, np.ndarray] | None = None
        for gap in (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0):
            c0 = float(y.min()) - gap * span
            coef = np.linalg.lstsq(design, np.log(y - c0), rcond=None)[0]  # (1 + K,)
            theta, cost = _levenberg_marquardt(r, y, np.concatenate([[c0], coef]), iterations)
            if best is None or cost < best[0]:
                best = (cost, theta)
        cost, theta = best
        cs.append(theta[0])
        ks.append(math.exp(theta[1]))
        ts.append(theta[2:])
        rmses.append(math.sqrt(cost / r.shape[0]))
    return MixingLawFit(np.array(cs), np.array(ks), np.array(ts), np.array(rmses))


# ---------------------------------------------------------------- published mixtures

#: Published pretraining mixtures: for each, where it is printed, what the weight column
#: means, and per component its sampling weight in percent (as printed) and, where the
#: table gives them, its size and the epochs the run made over it. ``category`` files
#: each component under one of the broad categories of :func:`category_shares` (the
#: book's reading of the component's description in the paper).
PUBLISHED_MIXTURES: dict[str, dict] = {
    "GPT-3": {
        "source": "Brown et al. (2020), Table 2.2",
        "size_unit": "billion tokens",
        "budget": 300.0,  # billion training tokens
        "components": {
            # name: (weight %, size, epochs elapsed at 300B tokens, category)
            "Common Crawl (filtered)": (60.0, 410.0, 0.44, "web"),
            "WebText2": (22.0, 19.0, 2.9, "web"),
            "Books1": (8.0, 12.0, 1.9, "books"),
            "Books2": (8.0, 55.0, 0.43, "books"),
            "Wikipedia": (3.0, 3.0, 3.4, "wikipedia"),
        },
    },
    "LLaMA": {
        "source": "Touvron et al. (2023), Table 1",
        "size_unit": "GB on disk",
        "budget": None,  # the table's epochs are for the 1.4T-token runs; sizes are in bytes
        "components": {
            "CommonCrawl": (67.0, 3300.0, 1.10, "web"),
            "C4": (15.0, 783.0, 1.06, "web"),
            "Github": (4.5, 328.0, 0.64, "code"),
            "Wikipedia": (4.5, 83.0, 2.45, "wikipedia"),
            "Books": (4.5, 85.0, 2.23, "books"),
            "ArXiv": (2.5, 92.0, 1.06, "scientific"),
            "StackExchange": (2.0, 78.0, 1.03, "code"),
        },
    },
    "The Pile": {
        "source": "Gao et al. (2020), Table 1",
        "size_unit": "GiB (raw)",
        "budget": None,  # the weights are the shares of one 1254.20 GiB "effective" epoch
        "components": {
            "Pile-CC": (18.11, 227.12, 1.0, "web"),
            "PubMed Central": (14.40, 90.27, 2.0, "scientific"),
            "Books3": (12.07, 100.96, 1.5, "books"),
            "OpenWebText2": (10.01, 62.77, 2.0, "web"),
            "ArXiv": (8.96, 56.21, 2.0, "scientific"),
            "Github": (7.59, 95.16, 1.0, "code"),
            "FreeLaw": (6.12, 51.15, 1.5, "other"),
            "Stack Exchange": (5.13, 32.20, 2.0, "code"),
            "USPTO Backgrounds": (3.65, 22.90, 2.0, "other"),
            "PubMed Abstracts": (3.07, 19.26, 2.0, "scientific"),
            "Gutenberg (PG-19)": (2.17, 10.88, 2.5, "books"),
            "OpenSubtitles": (1.55, 12.98, 1.5, "other"),
            "Wikipedia (en)": (1.53, 6.38, 3.0, "wikipedia"),
            "DM Mathematics": (1.24, 7.75, 2.0, "other"),
            "Ubuntu IRC": (0.88, 5.52, 2.0, "other"),
            "BookCorpus2": (0.75, 6.30, 1.5, "books"),
            "EuroParl": (0.73, 4.59, 2.0, "other"),
            "HackerNews": (0.62, 3.90, 2.0, "other"),
            "YoutubeSubtitles": (0.60, 3.73, 2.0, "other"),
            "PhilPapers": (0.38, 2.38, 2.0, "scientific"),
            "NIH ExPorter": (0.30, 1.89, 2.0, "scientific"),
            "Enron Emails": (0.14, 0.88, 2.0, "other"),
        },
    },
}

#: The broad categories :func:`category_shares` sums into.
CATEGORIES = ("web", "books", "wikipedia", "code", "scientific", "curated", "other")


def category_shares(components: Mapping[str, tuple], categories: Sequence[str] = CATEGORIES
                    ) -> dict[str, float]:
    """Sum the weights (percent) of a mixture's components by category.

    ``components`` maps a component's name to a tuple whose first entry is its weight
    and last entry its category (the layout of :data:`PUBLISHED_MIXTURES`). Returns
    ``{category: percent}`` for every name in ``categories`` (0 where none), in that
    order. A component whose category is not listed is a ``ValueError``.
    """
    if not isinstance(components, Mapping) or not components:
        raise TypeError(f"components must be a non-empty mapping, got {type(components).__name__}")
    shares = dict.fromkeys(categories, 0.0)
    for name, entry in components.items():
        if not isinstance(entry, tuple) or len(entry) < 2:
            raise ValueError(f"components[{name!r}] must be a tuple (weight, ..., category), "
                             f"got {entry!r}")
        weight, category = entry[0], entry[-1]
        if category not in shares:
            raise ValueError(f"components[{name!r}] has category {category!r}, not one of "
                             f"{list(categories)}")
        shares[category] += float(weight)
    return shares


def total_variation(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """TV(p, q) = 1/2 sum_c |p_c - q_c| between two mixtures given as ``{category: weight}``.

    Each mapping is normalised to sum 1 first (so percentages and raw weights both work);
    both must name the same categories. The result is the share of one mixture that would
    have to move to turn it into the other: 0 for equal mixtures, 1 for disjoint ones.
    """
    for name, m in (("a", a), ("b", b)):
        if not isinstance(m, Mapping) or not m:
            raise TypeError(f"{name} must be a non-empty mapping of category -> weight, got {type(m).__name__}")
    if set(a) != set(b):
        raise ValueError(f"a and b must name the same categories, got {sorted(a)} and {sorted(b)}")
    keys = list(a)
    p = _distribution("a", [a[k] for k in keys])
    q = _distribution("b", [b[k] for k in keys])
    return float(0.5 * np.abs(p - q).sum())
