"""The reader's workbench: exercise stubs, their checks and the grader (issue 28).

Every chapter's exercises have reference solutions (``notebooks/solutions/NN_slug.py``,
shipped in a wheel as ``llmbook/workbench/_solutions/``). This package turns them into a
course a reader can check their own code against:

* :mod:`llmbook.workbench.solutions` — where the reference solutions are; loading a
  module from a file by path (the tests' ``load_solutions`` is this one).
* :mod:`llmbook.workbench.catalogue` — each chapter's exercises (number, stars, title),
  parsed from the chapters' ``## Exercises`` sections and shipped as ``exercises.json``.
* :mod:`llmbook.workbench.stubs` — stubs generated from the solutions' source (same
  signatures and docstrings, bodies raising ``NotImplementedError``); ``llmbook exercises``.
* :mod:`llmbook.workbench.checks` — the checks of each chapter's exercises
  (``checks/ch03.py``, chapter 3), run on any module of answers; the repository's
  ``tests/test_solutions_NN.py`` run them on the reference solutions.
* :mod:`llmbook.workbench.runner` — runs a chapter's checks on answers with a time limit
  per exercise and classifies each outcome; the grader's subprocess.
* :mod:`llmbook.workbench.grader` — :func:`~llmbook.workbench.grader.grade` and
  ``llmbook grade``: one row per exercise, passed / failed / not attempted / error.
* :mod:`llmbook.workbench.units` — the build-it-yourself track: one unit per Part
  (``llmbook grade build-II``), its reference the book's own code plugged in, its checks
  ``checks/buildN.py``.

``grade`` is here for a notebook's last cell, ``grade("03", globals())``.

It ranks after every part of the book (its checks import any of them), with the reader's
commands; nothing in the parts imports it.
"""

from llmbook.workbench.grader import grade

__all__ = ["grade"]
