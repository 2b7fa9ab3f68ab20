"""Build ``data/stdlib_docs.txt``: the docstrings of Python's standard library as one text.

The book needs a small corpus of real English for training tokenizers and language
models without a network. The Python standard library documents itself: every public
module, class and function carries a docstring written in English (with code mixed
in). This script walks a fixed, sorted list of standard-library modules, imports each
one, and writes its docstrings in a fixed order:

* ``# module <name>`` then the module docstring;
* for each public class or function defined in the module (sorted by name), a line
  ``## <name><signature>`` and its docstring; for classes, the public methods
  (sorted by name) as ``### <Class>.<method>`` with their docstrings.

Docstrings are read with :func:`inspect.getdoc` (indentation cleaned). Modules that
fail to import on this machine are skipped and named on stderr. The text depends on
the Python version (the committed file was made with CPython 3.11.7).

Usage (from the repository root)::

    .venv/bin/python data/make_stdlib_docs.py            # writes data/stdlib_docs.txt
    .venv/bin/python data/make_stdlib_docs.py --check    # rebuild in memory, compare

The Python documentation is under the PSF licence; see ``data/LICENSE-PSF.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import io
import sys
import warnings
from pathlib import Path

OUT = Path(__file__).resolve().parent / "stdlib_docs.txt"

# Public, portable standard-library modules (and a few public submodules), sorted.
# Left out on purpose: modules with import side effects (antigravity, this), GUI and
# platform-specific modules (tkinter, turtle, curses, msvcrt, winreg, ...), the test
# suite and tools (test, idlelib, turtledemo, lib2to3, ensurepip, pydoc_data,
# distutils), and the codec tables in encodings.
MODULES = sorted([
    "asyncio.base_events", "asyncio.events", "asyncio.futures", "asyncio.locks",
    "asyncio.protocols", "asyncio.queues", "asyncio.streams", "asyncio.subprocess",
    "asyncio.tasks", "asyncio.transports", "concurrent.futures.process",
    "concurrent.futures.thread", "ctypes", "ctypes.util", "dbm", "dbm.dumb",
    "email.charset", "email.contentmanager", "email.feedparser", "email.generator",
    "email.header", "email.headerregistry", "email.mime.multipart", "email.parser",
    "importlib.machinery", "multiprocessing.connection", "multiprocessing.managers",
    "multiprocessing.shared_memory", "unittest.case", "unittest.loader",
    "unittest.result", "unittest.runner", "unittest.suite", "urllib.response",
    "wsgiref.handlers", "wsgiref.headers", "wsgiref.validate", "xml.dom",
    "xml.dom.pulldom", "xml.parsers.expat", "xml.sax.handler", "xml.sax.xmlreader",
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bdb", "binascii", "bisect",
    "builtins", "bz2", "calendar", "cmath", "cmd", "code", "codecs", "codeop",
    "collections", "collections.abc", "colorsys", "compileall",
    "concurrent.futures", "configparser", "contextlib", "contextvars", "copy", "copyreg",
    "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "doctest",
    "email", "email.message", "email.mime.text", "email.policy", "email.utils",
    "enum", "errno", "faulthandler", "filecmp", "fileinput", "fnmatch", "fractions",
    "ftplib", "functools", "gc", "getopt", "getpass", "gettext", "glob", "graphlib",
    "gzip", "hashlib", "heapq", "hmac", "html", "html.parser", "http", "http.client",
    "http.cookiejar", "http.cookies", "http.server", "imaplib", "importlib",
    "importlib.abc", "importlib.metadata", "importlib.resources", "importlib.util",
    "inspect", "io", "ipaddress", "itertools", "json", "json.decoder", "json.encoder",
    "keyword", "linecache", "locale", "logging", "logging.config", "logging.handlers",
    "lzma", "mailbox", "marshal", "math", "mimetypes", "mmap", "modulefinder",
    "multiprocessing", "multiprocessing.pool", "netrc", "numbers", "operator",
    "optparse", "os", "os.path", "pathlib", "pdb", "pickle", "pickletools", "pkgutil",
    "platform", "plistlib", "poplib", "pprint", "profile", "pstats", "py_compile",
    "pyclbr", "pydoc", "queue", "quopri", "random", "re", "reprlib", "rlcompleter",
    "runpy", "sched", "secrets", "select", "selectors", "shelve", "shlex", "shutil",
    "signal", "site", "smtplib", "socket", "socketserver", "sqlite3", "ssl", "stat",
    "statistics", "string", "stringprep", "struct", "subprocess", "symtable", "sys",
    "sysconfig", "tabnanny", "tarfile", "tempfile", "textwrap", "threading", "time",
    "timeit", "token", "tokenize", "tomllib", "trace", "traceback", "tracemalloc",
    "types", "typing", "unicodedata", "unittest", "unittest.mock", "urllib.error",
    "urllib.parse", "urllib.request", "urllib.robotparser", "uuid", "venv",
    "warnings", "wave", "weakref", "webbrowser", "wsgiref.simple_server",
    "wsgiref.util", "xml.dom.minidom", "xml.etree.ElementTree", "xml.sax",
    "xml.sax.saxutils", "xmlrpc.client", "xmlrpc.server", "zipapp", "zipfile",
    "zipimport", "zlib", "zoneinfo",
])


def _signature(obj: object) -> str:
    """The call signature with defaults shown as ``...``: ``(a, b=..., *, c=...)``.

    Default values are left out because some of them depend on the machine (paths,
    memory addresses); annotations are left out to keep the text prose-like.
    """
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    params = [p.replace(default=Ellipsis if p.default is not p.empty else p.empty,
                        annotation=p.empty) for p in sig.parameters.values()]
    text = str(sig.replace(parameters=params, return_annotation=sig.empty))
    return text.replace("=Ellipsis", "=...")


def _public_members(module: object) -> list[tuple[str, object]]:
    """Public classes and functions that ``module`` defines itself, sorted by name."""
    found = []
    for name in sorted(vars(module)):
        if name.startswith("_"):
            continue
        obj = vars(module)[name]
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        owner = getattr(obj, "__module__", None) or ""
        if owner != module.__name__ and owner.lstrip("_") != module.__name__.lstrip("_"):
            continue
        found.append((name, obj))
    return found


def _module_text(name: str, module: object) -> str:
    parts = [f"# module {name}\n\n{inspect.getdoc(module) or ''}".rstrip()]
    for member_name, obj in _public_members(module):
        doc = inspect.getdoc(obj)
        if not doc:
            continue
        sig = _signature(obj) if inspect.isroutine(obj) else ""
        parts.append(f"## {member_name}{sig}\n\n{doc}".rstrip())
        if inspect.isclass(obj):
            for meth_name in sorted(vars(obj)):
                if meth_name.startswith("_"):
                    continue
                meth = vars(obj)[meth_name]
                meth_doc = inspect.getdoc(meth) if inspect.isroutine(meth) else None
                if meth_doc and meth_doc != doc:
                    parts.append(f"### {member_name}.{meth_name}\n\n{meth_doc}".rstrip())
    return "\n\n".join(parts)


def build() -> str:
    """Return the corpus text (deterministic for a given Python version)."""
    texts = []
    for name in MODULES:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure means "skip it"
            print(f"skipped {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        texts.append(_module_text(name, module))
    text = "\n\n\n".join(texts) + "\n"
    # Docstrings are printable text; drop any stray NUL or other C0 controls except
    # tab and newline so that the file is plain text everywhere.
    return "".join(c for c in text if c in "\t\n" or not (ord(c) < 32 or ord(c) == 127))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="rebuild in memory and compare with the committed file")
    args = parser.parse_args()
    text = build()
    data = text.encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()[:16]
    if args.check:
        same = OUT.exists() and OUT.read_bytes() == data
        print(f"{OUT.name}: {'identical' if same else 'DIFFERS'} (rebuilt {len(data)} bytes, "
              f"sha256 {digest}, Python {sys.version.split()[0]})")
        return 0 if same else 1
    OUT.write_bytes(data)
    print(f"wrote {OUT} ({len(data)} bytes, {len(text)} characters, sha256 {digest}, "
          f"Python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
