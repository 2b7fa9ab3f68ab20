"""llmbook: the code of an executable textbook on the mathematics of large language models."""

import warnings

# Inside Jupyter without ipywidgets, tqdm.auto (imported by transformers) warns once per
# kernel that it falls back to a text progress bar. The fallback is what the book wants,
# and the warning would otherwise land in a notebook's committed outputs.
warnings.filterwarnings("ignore", message="IProgress not found")

__version__ = "0.1.0"
