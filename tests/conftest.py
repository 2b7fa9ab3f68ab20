"""Fixtures shared by the test files."""

from __future__ import annotations

import os

import pytest
import torch

# Without a GPU, the Triton kernels are tested under the interpreter. The variable must be
# set before llmbook.inference.flash_triton is first imported, by whichever test gets there
# first (test_architecture imports every module), so it is set here, for the whole session.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (make test runs two workers), each worker gets its share of the cores:
# two workers of two threads each on a 2-core machine make OpenMP's threads wait for one
# another, and a matrix-vector product of the real model (chapter 7) then runs tens of
# times slower than on one thread.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one thread is faster, and undisturbed by other work on the machine.

    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trl():
    """trl, imported once (slow); the peer tests are written against 1.16.0's internals."""
    trl = pytest.importorskip("trl")
    if trl.__version__ != "1.16.0":
        pytest.skip(f"peer tests read trl 1.16.0's trainer internals, found trl {trl.__version__}")
    return trl


@pytest.fixture(scope="session")
def smollm2_peer():
    """transformers' own load of the real model, ``(LlamaForCausalLM, tokenizer)``, made once
    per test process (about 15 s): the independent peer of the book's GGUF reader.

    Shared by every test file that compares with it, so a test must not change it: one that
    wraps it (peft's ``get_peft_model`` edits the model in place) takes a ``copy.deepcopy``.
    """
    from llmbook.inference.gguf import transformers_peer

    return transformers_peer()
