"""JupyterLab's configuration for ``make lab`` (``jupyter lab --config=tools/jupyter_lab_config.py``).

What it sets is in ``tools/lab.py``: the server's root (``notebooks/``), the contents manager
that pairs each chapter's ``.ipynb`` with its ``.py`` and lists it once, and ``allow_root``
when run as root.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lab import configure  # noqa: E402

configure(get_config())  # noqa: F821 (get_config is defined by Jupyter when it runs this file)
