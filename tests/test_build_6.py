"""The build-it-yourself unit of Part VI (scale): its reference, and a plain version written
from its docstrings alone, pass every check on real processes; planted bugs fail the check of
their exercise with a message that names the problem; a deadlock ends with a clear failure
instead of a hang; and the reader's functions reach the ranks however they were defined
(importable module, file loaded by path, notebook-like namespace via cloudpickle), in this
process and through the grader's subprocess.

The checks run ``llmbook.scale.launch.run`` on 2 to 4 gloo processes; the first call starts
the launcher's fork server (a few seconds), later ones take a fraction of a second.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from llmbook.workbench import checks as checks_package
from llmbook.workbench.solutions import load_module

STEM = "build6_distributed"
reference = importlib.import_module(f"llmbook.workbench.units.{STEM}")
checks = importlib.import_module("llmbook.workbench.checks.build6")

pytestmark = pytest.mark.usefixtures("one_thread")

CHECKS = sorted((n for n, f in vars(checks).items() if n.startswith("exercise_") and inspect.isfunction(f)),
                key=lambda n: int(n.split("_")[1]))


def _number(name: str) -> int:
    return int(re.match(r"exercise_(\d+)", name).group(1))


def _check(number: int):
    (name,) = [n for n in CHECKS if _number(n) == number]
    return getattr(checks, name)


@pytest.mark.parametrize("name", CHECKS)
def test_reference_passes(name: str) -> None:
    getattr(checks, name)(reference)


# ---------------------------------------------------------------- a reader's plain version
#
# Written from the reference's docstrings alone, with torch.distributed's point-to-point calls.
# They live in this (importable) module, so the checks send them to the ranks by reference: the
# rank imports test_build_6 and looks the plain_ names up there, and so they call one another.


def plain_ring_reduce_scatter(tensor):
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = tensor.view(-1).tensor_split(p)
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        incoming = chunks[(r - s - 2) % p]
        buffer = torch.empty_like(incoming)
        send = dist.isend(chunks[(r - s - 1) % p], right)
        recv = dist.irecv(buffer, left)
        send.wait()
        recv.wait()
        incoming += buffer
    return chunks[r]


def plain_ring_all_gather(tensor):
    """Blocking send and recv, ordered so that no cycle of senders forms: even ranks send
    first, odd ranks receive first (on an odd ring the last, even rank sends to rank 0, which
    is sending too, but rank 1 receives, so the chain unwinds)."""
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = tensor.view(-1).tensor_split(p)
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        outgoing, incoming = chunks[(r - s) % p], chunks[(r - s - 1) % p]
        if r % 2 == 0:
            dist.send(outgoing, right)
            dist.recv(incoming, left)
        else:
            dist.recv(incoming, left)
            dist.send(outgoing, right)
    return tensor


def plain_ring_all_reduce(tensor):
    plain_ring_reduce_scatter(tensor)
    return plain_ring_all_gather(tensor)


def plain_average_gradients(model):
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    plain_ring_all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


PLAIN = SimpleNamespace(ring_reduce_scatter=plain_ring_reduce_scatter, ring_all_gather=plain_ring_all_gather,
                        ring_all_reduce=plain_ring_all_reduce, average_gradients=plain_average_gradients)


def test_the_plain_version_reaches_the_ranks_by_reference() -> None:
    for name, fn in vars(PLAIN).items():
        portable = checks._Portable(name, fn)
        assert portable.how == "reference" and portable.payload == (__name__, fn.__name__), portable.payload
        assert portable.rebuild() is fn


@pytest.mark.parametrize("name", CHECKS)
def test_a_plain_version_passes_too(name: str) -> None:
    getattr(checks, name)(PLAIN)


# ---------------------------------------------------------------- planted bugs, in a file

HEADER = "import torch\nimport torch.distributed as dist\n\n"

BUGS = {
    "overwrite": ("ring_reduce_scatter", 1, "expected chunk", '''
def ring_reduce_scatter(tensor):
    """Receives straight into its chunk: overwrites instead of adding."""
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = tensor.view(-1).tensor_split(p)
    for s in range(p - 1):
        requests = [dist.isend(chunks[(r - s - 1) % p], (r + 1) % p),
                    dist.irecv(chunks[(r - s - 2) % p], (r - 1) % p)]
        for request in requests:
            request.wait()
    return chunks[r]
'''),
    "reduce_scatter_schedule": ("ring_all_gather", 2, "NaN marks a chunk never received", '''
def ring_all_gather(tensor):
    """Follows the reduce-scatter's schedule: passes on chunk (r - s - 1), not its own (r - s)."""
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = tensor.view(-1).tensor_split(p)
    for s in range(p - 1):
        send = chunks[(r - s - 1) % p].clone()
        requests = [dist.isend(send, (r + 1) % p), dist.irecv(chunks[(r - s - 2) % p], (r - 1) % p)]
        for request in requests:
            request.wait()
    return tensor
'''),
    "size_mismatch": ("ring_all_gather", 2, "a rank stopped abruptly", '''
def ring_all_gather(tensor):
    """Receives into the chunk it sent: with chunks of unequal sizes, a message of 7 elements
    arrives in a buffer of 6, and gloo ends the receiving process."""
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = tensor.view(-1).tensor_split(p)
    for s in range(p - 1):
        send = chunks[(r - s - 1) % p].clone()
        requests = [dist.isend(send, (r + 1) % p), dist.irecv(chunks[(r - s - 1) % p], (r - 1) % p)]
        for request in requests:
            request.wait()
    return tensor
'''),
    "built_in": ("ring_all_reduce", 3, "torch.distributed.all_reduce is a built-in collective", '''
def ring_all_reduce(tensor):
    """Calls the collective it should build."""
    dist.all_reduce(tensor)
    return tensor
'''),
    "no_division": ("average_gradients", 4, "to hold the parameters of one process", '''
def average_gradients(model):
    """Sums the gradients but forgets to divide by the number of ranks."""
    from llmbook.scale.collectives import ring_all_reduce_

    for p in model.parameters():
        if p.grad is not None:
            ring_all_reduce_(p.grad)
'''),
}

DEADLOCK = '''
def ring_reduce_scatter(tensor):
    """Every rank receives first: nobody ever sends."""
    p, r = dist.get_world_size(), dist.get_rank()
    buffer = torch.empty(3, dtype=tensor.dtype)
    dist.recv(buffer, (r - 1) % p)
    return tensor
'''


def _load(tmp_path: Path, source: str) -> types.ModuleType:
    """The file ``HEADER + source`` loaded by path, as the grader loads a reader's file (under
    a name of its own per test: the module stays in sys.modules, as the grader's does)."""
    name = f"answers_build6_{tmp_path.name}"
    path = tmp_path / "answers.py"
    path.write_text(HEADER + source)
    return load_module(path, name)


def _namespace(**replaced) -> SimpleNamespace:
    public = {n: f for n, f in vars(reference).items() if inspect.isfunction(f) and not n.startswith("_")
              and f.__module__ == reference.__name__}
    return SimpleNamespace(**{**public, **replaced})


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_fails_its_exercise(tmp_path: Path, bug: str) -> None:
    """The buggy function comes from a file loaded by path, so it also reaches the ranks by
    path. The other exercises call the reference's functions only (exercise 4 the reference's
    ring_all_reduce): they pass, as test_reference_passes shows."""
    name, number, words, source = BUGS[bug]
    fn = getattr(_load(tmp_path, source), name)
    assert checks._Portable(name, fn).how == "path"
    with pytest.raises(AssertionError) as err:
        _check(number)(_namespace(**{name: fn}))
    assert words in str(err.value), str(err.value)


def test_a_deadlock_fails_within_the_time_out(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(checks, "RANK_TIMEOUT", 3.0)
    fn = _load(tmp_path, DEADLOCK).ring_reduce_scatter
    with pytest.raises(AssertionError, match=r"waited more than 3 s .*\(your line \d+, in ring_reduce_scatter\)"
                                             r": a deadlock"):
        _check(1)(_namespace(ring_reduce_scatter=fn))


def test_functions_without_a_module_reach_the_ranks_by_value() -> None:
    """As in a notebook: functions whose module no process can import or load, calling one
    another (the plain version's ring, defined again in a cell); cloudpickle sends them with
    the globals they use."""
    pytest.importorskip("cloudpickle")
    cells = types.ModuleType("notebook_cells")  # not in sys.modules, no __file__
    source = "\n\n".join(inspect.getsource(fn) for fn in (plain_ring_reduce_scatter, plain_ring_all_gather,
                                                           plain_ring_all_reduce))
    exec(compile(HEADER + source, "<notebook cell>", "exec"), cells.__dict__)
    assert checks._Portable("ring_all_reduce", cells.plain_ring_all_reduce).how == "value"
    assert checks._Portable("ring_all_reduce", reference.ring_all_reduce).how == "reference"
    _check(3)(_namespace(ring_all_reduce=cells.plain_ring_all_reduce))


# ---------------------------------------------------------------- graded by file, in a subprocess


def test_stub_grades_as_not_attempted(tmp_path: Path) -> None:
    from llmbook.workbench.grader import grade
    from llmbook.workbench.stubs import make_stub

    stub = tmp_path / f"{STEM}.py"
    stub.write_text(make_stub(Path(reference.__file__).read_text(), STEM))
    rows = list(grade(STEM, stub))
    assert [r.exercise for r in rows] == sorted(checks.EXERCISES)
    assert all(r.status == "not attempted" for r in rows), [(r.exercise, r.status, r.detail) for r in rows]
    assert set(checks_package.checks_for(STEM)) == set(checks.EXERCISES)


def test_a_file_graded_in_a_subprocess(tmp_path: Path, monkeypatch) -> None:
    """The reference with a deadlocking ring_reduce_scatter appended: the grader's child loads
    the file as answers_build6, which no rank can import, so the ranks load it by path; the
    deadlock fails exercise 1 alone, within the (shortened) time-out, and the rest pass."""
    from llmbook.workbench.grader import grade

    answers = tmp_path / "answers.py"
    answers.write_text(Path(reference.__file__).read_text() + "\n" + DEADLOCK)
    monkeypatch.setenv("LLMBOOK_RANK_TIMEOUT", "3")
    rows = {r.exercise: r for r in grade(STEM, answers)}
    assert sorted(rows) == sorted(checks.EXERCISES)
    assert rows[1].status == "failed" and "a deadlock" in rows[1].detail, (rows[1].status, rows[1].detail)
    assert "your line" in rows[1].detail, rows[1].detail
    assert all(rows[n].status == "passed" for n in (2, 3, 4)), [(r.exercise, r.status, r.detail)
                                                                 for r in rows.values()]
