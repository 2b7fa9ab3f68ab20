"""Run a function on several processes joined by ``torch.distributed``: the book's launcher.

Introduced in notebooks/22_distributed_training. ``torchrun`` starts one process per rank and
lets them find each other through a rendezvous; :func:`run` does the same from inside Python
(a notebook, a test), so that chapter 22 uses the real engine that users scale out on, with
several real processes, instead of simulating communication in one:

* the parent opens a :class:`torch.distributed.TCPStore` on a free port of the loopback
  interface (port 0: the system picks one, so two runs never collide), and starts
  ``world_size`` processes;
* each process joins the process group through that store, with the ``gloo`` backend on
  the CPU (``nccl`` where there are GPUs, one per rank), calls ``fn(rank, world_size, *args)``
  and sends back what it returned, or its traceback;
* the parent waits for all of them with a deadline. A rank that raises makes :func:`run`
  raise :class:`WorkerError` with that rank's traceback, a rank that dies without a word or
  a run past its deadline raises too, and the other processes are stopped. Nothing hangs.

Processes are started with ``forkserver``: a server process imports torch once, and each
rank is forked from it, which takes milliseconds instead of the seconds of a fresh
interpreter, while staying safe for threaded libraries (the server never ran torch's thread
pools; forking the notebook's own process would copy them in an undefined state). Where
``forkserver`` does not exist (Windows) it falls back to ``spawn``. As with any
``multiprocessing`` code, a *script* that calls :func:`run` must do so under
``if __name__ == "__main__":``, since each new process imports the script's main module;
notebooks and tests need nothing.

``fn`` must be importable by name (defined in a module, not in a notebook cell), and what it
returns must be picklable; tensors come back by value.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["WorkerError", "run", "loopback_interface"]

#: Seconds a process may take to start and join the group, on top of the run's own timeout.
STARTUP_SECONDS = 60.0

#: What the fork server imports once, so that no rank pays for it: torch, and what torch's
#: optimisers import on first use (``torch._dynamo``, several seconds per process on a small
#: machine), and SymPy, which the chapter's modules import.
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.fx.experimental.symbolic_shapes",
           "sympy", "llmbook.scale.launch")


class WorkerError(RuntimeError):
    """A rank of :func:`run` failed; the message holds its rank and traceback."""


def loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS).

    gloo picks the interface whose address the host name resolves to; on some machines that
    address is not reachable from the machine itself. Pinning gloo to the loopback keeps a
    single-machine run off the network.
    """
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):  # pragma: no cover - Windows, sandboxes
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


def _context() -> Any:
    methods = mp.get_all_start_methods()
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))  # effective when the server first starts
        return ctx
    return mp.get_context("spawn")  # pragma: no cover - Windows


def _worker(fn: Callable[..., Any], rank: int, world_size: int, args: tuple[Any, ...],
            backend: str, port: int, timeout: float, threads: int, results: Any) -> None:
    """One rank: join the group through the parent's store, call ``fn``, report back.

    Everything the rank writes to stdout and stderr (prints, warnings, gloo's own log lines)
    goes to a file of its own and travels back with the result, so that output from several
    processes never interleaves in an order that changes from run to run.
    """
    with tempfile.TemporaryFile(mode="w+b") as log:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        failed_at = time.monotonic()  # a failure before fn runs dates from the start
        try:
            torch.set_num_threads(threads)
            if backend == "nccl":  # pragma: no cover - needs GPUs
                torch.cuda.set_device(rank % torch.cuda.device_count())
            store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False,
                                  timeout=timedelta(seconds=STARTUP_SECONDS))
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=timeout))
            # every rank finishes joining before any runs fn: a rank whose fn fails at once
            # would otherwise close its sockets while a slower peer is still connecting, and
            # that peer's "connection closed" (dated from the start, so taken for the cause)
            # would hide the real error
            dist.barrier()
            try:
                value = fn(rank, world_size, *args)
            except BaseException:
                failed_at = time.monotonic()  # before tearing down: peers fail after this
                raise
            finally:
                dist.destroy_process_group()
            status, payload = "ok", pickle.dumps(value)
        except BaseException:  # noqa: BLE001 - every failure must reach the parent
            status, payload = "error", (failed_at, traceback.format_exc())
        sys.stdout.flush()
        sys.stderr.flush()
        log.seek(0)
        output = log.read().decode(errors="replace")
        results.put((rank, status, payload, output))


def run(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
        timeout: float = 60.0, threads_per_rank: int = 1, echo: bool = False) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return their results.

    Args:
        fn: a module-level function; inside it ``torch.distributed`` is initialised, so it can
            call ``dist.all_reduce``, ``dist.send`` and the rest.
        world_size: the number of processes (ranks), at least 1.
        *args: passed to every rank (pickled).
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank).
        timeout: seconds the ranks may spend in ``fn``; also the process group's timeout for a
            collective that some rank never joins. Starting the processes and joining the
            group has its own allowance, :data:`STARTUP_SECONDS` (60 s), so a run that hangs
            is stopped after at most ``STARTUP_SECONDS + timeout`` seconds.
        threads_per_rank: torch's intra-op threads in each process.
        echo: print what each rank wrote to stdout/stderr, rank by rank, after the run. Off by
            default, so that a notebook's output does not depend on the processes' timing; a
            failing rank's output is always part of the error.

    Returns:
        ``[result of rank 0, result of rank 1, ...]``.

    Raises:
        WorkerError: a rank raised (the message has its rank and traceback), died without
            reporting (e.g. killed), or the run passed its deadline.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < 1:
        raise ValueError("backend 'nccl' needs CUDA GPUs; use 'gloo' on the CPU")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not callable(fn) or "<locals>" in getattr(fn, "__qualname__", "") or \
            getattr(fn, "__module__", "__main__") == "__main__":
        raise TypeError(f"fn must be a module-level function that the ranks can import by name, "
                        f"got {fn!r}: define it in a module, not in a notebook cell")
    iface = loopback_interface()
    if iface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
    ctx = _context()
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True,
                          wait_for_workers=False, timeout=timedelta(seconds=STARTUP_SECONDS))
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(fn, rank, world_size, tuple(args), backend, store.port,
                               float(timeout), threads_per_rank, results))
             for rank in range(world_size)]
    try:
        for proc in procs:
            proc.start()
        values, outputs = _collect(procs, results, time.monotonic() + STARTUP_SECONDS + timeout)
        if echo:
            for rank, output in enumerate(outputs):
                if output:
                    print(f"[rank {rank}]\n{output}", end="" if output.endswith("\n") else "\n")
        return values
    finally:
        # an interruption while the ranks start (a grader's time limit) leaves some unstarted,
        # and joining a process that never started raises, hiding the interruption
        procs = [proc for proc in procs if proc.pid is not None]
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():  # pragma: no cover - a process that ignores SIGTERM
                proc.kill()
                proc.join()
        results.close()
        del store


def _first_failure(procs: Sequence[Any], results: Any,
                   failures: dict[int, tuple[float, str, str]], grace: float = 2.0) -> WorkerError:
    """The error of the rank that failed first, once the others have had ``grace`` seconds to
    report: when one rank raises, its peers' collectives fail too ("connection closed by
    peer"), and one of those reports may reach the queue before the cause does."""
    end = time.monotonic() + grace
    while time.monotonic() < end and len(failures) < len(procs):
        try:
            rank, status, payload, output = results.get(timeout=0.05)
        except queue.Empty:
            continue
        if status == "error":
            failures[rank] = (*payload, output)
    rank = min(failures, key=lambda r: failures[r][0])
    _, trace, output = failures[rank]
    others = sorted(set(failures) - {rank})
    return WorkerError(f"rank {rank} failed:\n{trace}" + (f"\nits output:\n{output}" if output else "")
                       + (f"\n(ranks {others} failed after it)" if others else ""))


def _collect(procs: Sequence[Any], results: Any,
             deadline: float) -> tuple[list[Any], list[str]]:
    """Gather one message per rank; raise on the first failure, death or the deadline."""
    world_size = len(procs)
    values: dict[int, Any] = {}
    outputs: dict[int, str] = {}
    while len(values) < world_size:
        try:
            message = results.get(timeout=0.05)
        except queue.Empty:
            dead = [rank for rank, proc in enumerate(procs)
                    if rank not in values and proc.exitcode is not None]
            if dead:
                try:  # it may have reported just before exiting: drain once more
                    message = results.get(timeout=0.5)
                except queue.Empty:
                    rank = dead[0]
                    raise WorkerError(f"rank {rank} died with exit code {procs[rank].exitcode} "
                                      f"before reporting a result") from None
            elif time.monotonic() > deadline:
                missing = sorted(set(range(world_size)) - set(values))
                raise WorkerError(f"ranks {missing} did not finish before the deadline "
                                  f"(timeout plus {STARTUP_SECONDS:.0f} s to start and join the "
                                  f"group); stopped all {world_size} processes") from None
            else:
                continue
        rank, status, payload, output = message
        if status == "error":
            raise _first_failure(procs, results, {rank: (*payload, output)})
        values[rank] = pickle.loads(payload)
        outputs[rank] = output
    return [values[r] for r in range(world_size)], [outputs[r] for r in range(world_size)]
