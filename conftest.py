"""pytest set-up shared by the unit tests and nbval (notebook kernels inherit this environment)."""

import os

# Repeatable string hashing in notebook kernels, as `make` sets it.
os.environ.setdefault("PYTHONHASHSEED", "0")
# tqdm.auto (imported by transformers) warns inside Jupyter when ipywidgets is absent; the
# warning names a local path, so it would make a notebook's output depend on the machine.
os.environ.setdefault("PYTHONWARNINGS", "ignore:IProgress not found")
