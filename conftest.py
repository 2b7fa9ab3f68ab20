"""pytest set-up shared by the unit tests and nbval (notebook kernels inherit this environment)."""

import atexit
import os
import shutil
import tempfile

# Repeatable string hashing in notebook kernels, as `make` sets it.
os.environ.setdefault("PYTHONHASHSEED", "0")
# tqdm.auto (imported by transformers) warns inside Jupyter when ipywidgets is absent; the
# warning names a local path, so it would make a notebook's output depend on the machine.
os.environ.setdefault("PYTHONWARNINGS", "ignore:IProgress not found")

# A test run leaves the checkout as it found it: figures that notebooks (under nbval) and
# tests save go to a throwaway folder, not to the tracked figures/. `make sync` and
# `make book` are what rewrite figures/.
if "LLMBOOK_FIGURES" not in os.environ:
    _figures = tempfile.mkdtemp(prefix="llmbook-test-figures-")
    os.environ["LLMBOOK_FIGURES"] = _figures
    atexit.register(shutil.rmtree, _figures, ignore_errors=True)

# Property tests draw the same examples on every run, so a test run is reproducible
# (a failure found once is found again) and CI cannot turn red by chance.
from hypothesis import settings  # noqa: E402

settings.register_profile("llmbook", derandomize=True, database=None, deadline=None)
settings.load_profile("llmbook")
