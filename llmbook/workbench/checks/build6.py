"""Checks of the build-it-yourself unit of Part VI (scale), run on ``solutions``.

The reader's functions are collectives: they run inside real processes joined by
``torch.distributed`` (gloo, on the CPU), started with the book's launcher
:func:`llmbook.scale.launch.run` on 2, 3 and 4 ranks. The peers are ``torch.distributed``'s
own collectives (``all_reduce``, ``all_gather_object``) run on the same tensors in the same
processes, and, end to end, the book's single-process training on the whole batch
(:func:`llmbook.scale.data_parallel.train_single_process`).

Getting the reader's functions into the processes. The launcher starts ranks from a fork
server and sends them the function to run by pickling it, which records a function by its
module and name; a reader's file is loaded by path under a name no process can import
(``answers_build6``), and a notebook's functions live in ``__main__``. So each function is
sent in a form the rank can rebuild (:class:`_Portable`): by reference when its module is
importable (the reference, a test module); by path when its module was loaded from a file
(the rank loads the file again, once, under the same name, with
:func:`llmbook.workbench.solutions.load_module`); by value with ``cloudpickle`` (if it is
installed) otherwise, e.g. for a notebook's functions, together with the globals they use.

While the reader's functions run in a rank, the built-in collectives of
``torch.distributed`` raise, so that the ring must be built from point-to-point messages.
A rank waiting for a message that never comes fails after :data:`RANK_TIMEOUT` seconds
(the process group's time-out) and the check reports a deadlock; a stub's
``NotImplementedError`` is raised in the grading process itself, by calling the function
there once before any process starts (without a process group, an implemented function
fails at its first ``dist`` call, which is ignored), so that it reads as "not attempted".
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import pickle
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

#: number: (stars, title), in the order of building.
EXERCISES = {
    1: (2, "Ring reduce-scatter from send and receive"),
    2: (1, "Ring all-gather"),
    3: (1, "Ring all-reduce, against torch.distributed.all_reduce"),
    4: (2, "End to end: data-parallel training with your all-reduce"),
}

#: Seconds a rank may wait in a collective or a receive (gloo's time-out), and may run; the
#: environment variable ``LLMBOOK_RANK_TIMEOUT`` changes it (the tests shorten it).
RANK_TIMEOUT = float(os.environ.get("LLMBOOK_RANK_TIMEOUT", "20"))

#: The collectives switched off while the reader's functions run in a rank.
FORBIDDEN = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
             "all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object",
             "all_to_all", "all_to_all_single", "all_reduce_coalesced", "reduce", "broadcast",
             "gather", "scatter")

f64 = torch.float64


# ---------------------------------------------------------------- the reader's functions in a rank


class _Portable:
    """A function the ranks can rebuild: by reference, by path, or by value (cloudpickle)."""

    def __init__(self, name: str, fn: Callable) -> None:
        fn = inspect.unwrap(fn)  # the grader wraps answers to check their return type
        self.name, self.file = name, getattr(getattr(fn, "__code__", None), "co_filename", None)
        module_name, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        module = sys.modules.get(module_name) if module_name else None
        found = module is not None and "<locals>" not in qualname and _lookup(module, qualname) is fn
        spec, path = getattr(module, "__spec__", None), getattr(module, "__file__", None)
        script = module_name == "__main__" and bool(path)  # multiprocessing re-runs it in a rank
        if found and (script or (module_name != "__main__" and spec is not None
                                 and spec.name == module_name)):
            self.how, self.payload = "reference", (module_name, qualname)
        elif found and module_name != "__main__" and path:
            # loaded by path (a reader's file): the rank loads the file again
            self.how, self.payload = "path", (path, f"_rank_{module_name.strip('_')}", qualname)
        else:
            try:
                import cloudpickle
            except ImportError:
                raise AssertionError(
                    f"{name} is defined in a notebook (or inside another function), and the "
                    f"processes that run it cannot import it from there: install cloudpickle "
                    f"(pip install cloudpickle), which sends it with the names it uses, or put "
                    f"your functions in a file and grade the file") from None
            self.how, self.payload = "value", cloudpickle.dumps(fn)

    def rebuild(self) -> Callable:
        if self.how == "value":
            return pickle.loads(self.payload)
        if self.how == "reference":
            module_name, qualname = self.payload
            obj: Any = importlib.import_module(module_name)
        else:
            from llmbook.workbench.solutions import load_module

            path, module_name, qualname = self.payload
            obj = sys.modules.get(module_name) or load_module(path, module_name)
        return _lookup(obj, qualname)


def _lookup(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _refuse(name: str) -> Callable:
    def refused(*args, **kwargs):
        raise RuntimeError(f"torch.distributed.{name} is a built-in collective, switched off while "
                           f"your functions run: build yours from dist.send/dist.recv (or "
                           f"dist.isend/dist.irecv)")
    return refused


@contextlib.contextmanager
def _own_collectives_only() -> Iterator[None]:
    """Make the built-in collectives raise (in ``torch.distributed`` and ``distributed_c10d``)."""
    from torch.distributed import distributed_c10d

    saved = []
    for module in (dist, distributed_c10d):
        for name in FORBIDDEN:
            if hasattr(module, name):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, _refuse(name))
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def _rank_main(rank: int, world_size: int, portables: dict[str, _Portable],
               task: Callable, *args: Any) -> Any:
    """What each rank runs: rebuild the reader's functions (with the collectives off, so that
    a file's ``from torch.distributed import all_reduce`` gets the refusing one too), then the
    task, which switches them off again around each call of the reader's code."""
    torch.set_num_threads(1)
    with _own_collectives_only():
        functions = {name: p.rebuild() for name, p in portables.items()}
    return task(rank, world_size, functions, *args)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')


def _explain(err: Exception, portables: dict[str, _Portable], what: str) -> str:
    """A rank's failure in plain words: its exception's last line and the reader's line."""
    from llmbook.scale.launch import STARTUP_SECONDS

    text = str(err)
    head = text.split("\n", 1)[0]
    if "did not finish before the deadline" in head:
        return (f"expected {what} to finish, but ranks were still running after "
                f"{RANK_TIMEOUT + STARTUP_SECONDS:g} s (a loop that never ends, or a deadlock)")
    trace = text.split("\nits output:", 1)[0]
    trace = re.sub(r"\n\(ranks \[[^\]]*\] failed after it\)\s*$", "", trace.rstrip())
    lines = [ln for ln in trace.splitlines() if ln.strip()]
    last = re.sub(r"^(\w+: )\[[^\]]+\] ", r"\1", lines[-1].strip() if lines else head)
    last = last.split(". This is typically caused", 1)[0]  # gloo's advice to read the logs
    files = {p.file for p in portables.values() if p.file}
    if any(p.how == "value" for p in portables.values()):
        files.add("<dynamic-code>")  # what cloudpickle names the file of a function it rebuilds
    mine = [m for m in _FRAME.finditer(trace) if m.group("file") in files]
    where = f" (your line {mine[-1].group('line')}, in {mine[-1].group('fn')})" if mine else ""
    rank = re.match(r"rank (\d+)", head)
    on = f" on rank {rank.group(1)}" if rank else ""
    if "died with exit code" in head or re.search(r"[Cc]onnection (reset|closed) by peer", last):
        return (f"expected {what} to run, but a rank stopped abruptly{where} (its peers then lose "
                f"the connection): gloo ends a process whose receive gets a message of another "
                f"size than its buffer, so check that the chunk each rank sends at a step is the "
                f"one its neighbour receives into; gloo said: {last}")
    if re.search(r"[Tt]imed? ?out|timeout", last):
        return (f"expected {what} to finish, but{on} a receive or a send waited more than "
                f"{RANK_TIMEOUT:g} s for its partner{where}: a deadlock (a recv with no matching "
                f"send, ranks waiting on each other in a cycle, or blocking sends posted before "
                f"any receive); gloo said: {last}")
    return f"expected {what} to run, but it raised{on}{where}: {last}"


def _probe(fn: Callable, argument: Any) -> None:
    """Call ``fn`` once here, outside any process group: a stub's NotImplementedError comes out
    of the reader's own line (so the grader reads it as "not attempted"); anything else an
    implemented function does without a process group is ignored."""
    try:
        fn(argument)
    except NotImplementedError:
        if not dist.is_initialized():
            raise
    except Exception:  # noqa: BLE001 - no process group here: the real run is in the ranks
        pass


def _attempted(answers: dict[str, Callable], probe: Any = None) -> dict[str, Callable]:
    """The reader's functions ``answers`` (by name), each probed (:func:`_probe`) on
    ``probe()`` or a float64 tensor of 8 zeros. The checks look the answers up as
    ``solutions.name``, which is how the grader knows which functions each exercise calls."""
    for fn in answers.values():
        _probe(fn, probe() if callable(probe) else torch.zeros(8, dtype=f64))
    return answers


def _launch(answers: dict[str, Callable], task: Callable, world_size: int, *args: Any,
            probe: Any = None, what: str = "") -> list[Any]:
    """Run ``task`` on ``world_size`` ranks with the reader's functions ``answers``."""
    from llmbook.scale.launch import WorkerError, run

    names = tuple(answers)
    answers = _attempted(answers, probe)
    portables = {name: _Portable(name, fn) for name, fn in answers.items()}
    try:
        return run(_rank_main, world_size, portables, task, *args, timeout=RANK_TIMEOUT)
    except WorkerError as err:
        raise AssertionError(_explain(err, portables, what or f"{names[-1]} on {world_size} ranks")) from None


def _largest(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def _show(t: torch.Tensor, n: int = 5) -> str:
    """The first ``n`` values of ``t``, flattened, rounded: ``[0.1235, -1.5, ...] (21 values)``."""
    flat = t.reshape(-1).tolist()
    shown = ", ".join(f"{v:.6g}" for v in flat[:n])
    return f"[{shown}{', ...' if len(flat) > n else ''}] ({len(flat)} values)"


def _data(rank: int, shape: tuple[int, ...], seed: int, dtype: torch.dtype = f64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed + 100 * rank), dtype=dtype)


SHAPES = ((3, 7), (13,))


# ---------------------------------------------------------------- 1. reduce-scatter


def _reduce_scatter_task(rank: int, world_size: int, fns: dict, shapes: tuple) -> list[dict]:
    results = []
    for shape in shapes:
        x = _data(rank, shape, 1)
        mine = x.clone()
        with _own_collectives_only():
            chunk = fns["ring_reduce_scatter"](mine)
        peer = x.clone()
        dist.all_reduce(peer)
        results.append({"chunk": torch.as_tensor(chunk).clone(),
                        "in_place": mine.view(-1).tensor_split(world_size)[rank].clone(),
                        "want": peer.view(-1).tensor_split(world_size)[rank].clone()})
    return results


def exercise_1_ring_reduce_scatter(solutions) -> None:
    for p in (2, 3, 4):
        ranks = _launch({"ring_reduce_scatter": solutions.ring_reduce_scatter}, _reduce_scatter_task, p, SHAPES,
                        what=f"ring_reduce_scatter on {p} ranks")
        for r, outs in enumerate(ranks):
            for shape, out in zip(SHAPES, outs, strict=True):
                chunk, want = out["chunk"], out["want"]
                assert tuple(chunk.shape) == tuple(want.shape), (
                    f"expected rank {r} of {p} to return its chunk {r} of {want.numel()} elements "
                    f"(tensor_split of {shape} into {p}), got shape {tuple(chunk.shape)}")
                err = _largest(chunk, want)
                assert err <= 1e-12, (
                    f"expected chunk {r} of the sum over {p} ranks (shape {shape}) on rank {r}, as "
                    f"dist.all_reduce gives it, {_show(want)}, to 1e-12; got {_show(chunk)} (largest "
                    f"difference {err:.3g})")
                err = _largest(out["in_place"], want)
                assert err <= 1e-12, (
                    f"expected the reduced chunk {r} to be written into rank {r}'s tensor (in place), "
                    f"but the tensor's chunk holds {_show(out['in_place'])}, not {_show(want)}")


# ---------------------------------------------------------------- 2. all-gather


def _all_gather_task(rank: int, world_size: int, fns: dict, shapes: tuple) -> list[dict]:
    results = []
    for shape in shapes:
        x = _data(rank, shape, 2)
        own = x.view(-1).tensor_split(world_size)[rank].clone()
        mine = torch.full_like(x, float("nan"))  # only chunk r is read: the rest must be overwritten
        mine.view(-1).tensor_split(world_size)[rank].copy_(own)
        with _own_collectives_only():
            out = fns["ring_all_gather"](mine)
        pieces: list[Any] = [None] * world_size
        dist.all_gather_object(pieces, own)
        results.append({"tensor": mine.clone(), "returned": torch.as_tensor(out).clone(),
                        "want": torch.cat(pieces).view(shape)})
    return results


def exercise_2_ring_all_gather(solutions) -> None:
    for p in (2, 3, 4):
        ranks = _launch({"ring_all_gather": solutions.ring_all_gather}, _all_gather_task, p, SHAPES,
                        what=f"ring_all_gather on {p} ranks")
        for r, outs in enumerate(ranks):
            for shape, out in zip(SHAPES, outs, strict=True):
                got, want = out["tensor"], out["want"]
                assert torch.equal(got, want), (
                    f"expected rank {r} of {p} to hold every rank's chunk (shape {shape}), exactly as "
                    f"dist.all_gather_object collects them: {_show(want)}; got {_show(got)}"
                    + (" (NaN marks a chunk never received)"
                                                   if bool(got.isnan().any()) else ""))
                assert torch.equal(out["returned"], want), (
                    f"expected ring_all_gather to return the gathered tensor on rank {r} of {p}, "
                    f"got {_show(out['returned'])}")


# ---------------------------------------------------------------- 3. all-reduce


def _all_reduce_task(rank: int, world_size: int, fns: dict, cases: tuple) -> list[dict]:
    results = []
    for shape, dtype in cases:
        x = _data(rank, shape, 3, dtype)
        mine = x.clone()
        with _own_collectives_only():
            out = fns["ring_all_reduce"](mine)
        peer = x.clone()
        dist.all_reduce(peer)
        results.append({"tensor": mine, "returned": torch.as_tensor(out), "want": peer})
    return results


#: (shape, dtype, absolute, relative tolerance) of the all-reduce's cases.
ALL_REDUCE_CASES = (((13,), f64, 1e-12, 0.0), ((3, 7), f64, 1e-12, 0.0), ((100_003,), f64, 1e-12, 0.0),
                    ((5, 6), torch.float32, 0.0, 1e-5))


def exercise_3_ring_all_reduce(solutions) -> None:
    for p in (2, 3, 4):
        cases = tuple((shape, dtype) for shape, dtype, _, _ in ALL_REDUCE_CASES)
        ranks = _launch({"ring_all_reduce": solutions.ring_all_reduce}, _all_reduce_task, p, cases,
                        what=f"ring_all_reduce on {p} ranks")
        for c, (shape, dtype, atol, rtol) in enumerate(ALL_REDUCE_CASES):
            kind = "float64" if dtype == f64 else "float32"
            for r, outs in enumerate(ranks):
                out = outs[c]
                got, want = out["tensor"], out["want"]
                assert got.dtype == dtype and tuple(got.shape) == shape, (
                    f"expected rank {r}'s tensor to keep its shape {shape} and dtype {kind}, got "
                    f"{tuple(got.shape)} {got.dtype}")
                err = _largest(got, want)
                bound = atol + rtol * float(want.abs().max())
                assert err <= bound, (
                    f"expected the sum over {p} ranks of a {kind} tensor of shape {shape}, as "
                    f"dist.all_reduce gives it, on rank {r} (to {atol or rtol:g} "
                    f"{'absolute' if atol else 'relative'}); largest difference {err:.3g}"
                    + (f": got {_show(got)}, expected {_show(want)}"
                       if err > bound else ""))
                assert torch.equal(out["returned"], got), (
                    f"expected ring_all_reduce to return the reduced tensor itself on rank {r}")
            first = ranks[0][c]["tensor"]
            assert all(torch.equal(outs[c]["tensor"], first) for outs in ranks), (
                f"expected every one of {p} ranks to end with the same sum (shape {shape}), bit for "
                f"bit, but they differ")


# ---------------------------------------------------------------- 4. end to end


SPEC = {"seed": 3, "steps": 3, "batch_size": 6, "lr": 0.01}


def _data_parallel_task(rank: int, world_size: int, fns: dict, spec: dict) -> dict:
    """The book's data-parallel loop (:func:`~llmbook.scale.data_parallel.train_steps`), with
    the reader's average_gradients as the gradient sync."""
    from llmbook.scale.data_parallel import tiny_language_model, train_steps

    model = tiny_language_model(spec["seed"])

    def sync() -> None:
        with _own_collectives_only():
            fns["average_gradients"](model)

    state, losses = train_steps(model, spec, rank, world_size, sync=sync)
    return {"state": state, "losses": losses}


def exercise_4_data_parallel_training(solutions) -> None:
    from llmbook.scale.data_parallel import train_single_process

    answers = {"ring_all_reduce": solutions.ring_all_reduce,
               "average_gradients": solutions.average_gradients}
    probe = lambda: torch.nn.Linear(3, 2).double()  # noqa: E731
    _attempted(answers, probe)  # a stub is "not attempted" before any training
    want_state, want_losses = train_single_process(SPEC)
    for p in (2, 3):
        results = _launch(answers, _data_parallel_task, p, SPEC, probe=probe,
                          what=f"data-parallel training with average_gradients on {p} ranks")
        for r, out in enumerate(results):
            err, where = max((_largest(out["state"][k], v), k) for k, v in want_state.items())
            assert err <= 1e-10, (
                f"expected rank {r} of {p}, after {SPEC['steps']} AdamW steps on its slice of the "
                f"batch with your average_gradients, to hold the parameters of one process trained "
                f"on the whole batch (to 1e-10); {where} differs by {err:.3g}")
        for step, want in enumerate(want_losses):
            mean = sum(out["losses"][step] for out in results) / p
            assert abs(mean - want) <= 1e-12, (
                f"expected the mean of the {p} ranks' losses at step {step} to be the whole batch's "
                f"loss {want!r} (to 1e-12), got {mean!r}")
