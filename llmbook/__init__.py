"""llmbook: the code of an executable textbook on the mathematics of large language models."""

__version__ = "0.1.0"
