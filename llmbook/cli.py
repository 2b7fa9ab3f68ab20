"""``llmbook``: the book's command line, one entry for every command a reader runs.

``llmbook`` alone (or ``llmbook --help``) lists the subcommands; ``llmbook NAME --help``
shows one's options and starts nothing. Each subcommand hands the rest of the line to the
``main`` of the module that does the work, so ``llmbook chat --fast`` is
``python -m llmbook.chat --fast``; the module is imported only when its subcommand runs,
so listing the commands is quick. ``llmbook bench`` runs the timing scripts of a source
checkout's ``benchmarks/`` (they compare against peers and are not part of the package).
"""

from __future__ import annotations

import argparse
import importlib
import runpy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COMMANDS", "Command", "benchmarks", "main"]


@dataclass(frozen=True)
class Command:
    """A subcommand: the module whose ``main(argv)`` runs it, and what it does."""

    module: str
    summary: str
    long: bool = False  #: True for sweeps and retraining: minutes of work when run


#: The subcommands in the order ``llmbook --help`` lists them.
COMMANDS: dict[str, Command] = {
    "chat": Command("llmbook.chat", "talk to the real model (SmolLM2-135M-Instruct) in the "
                    "terminal, streaming"),
    "model": Command("llmbook.inference.gguf", "describe the real model's GGUF file; --verify "
                     "checks its SHA-256, --install installs it"),
    "env": Command("llmbook.cli", "the packages, versions and data folders the book finds"),
    "models": Command("llmbook.training.pretrained", "retrain the book's two language models "
                      "and rewrite their files", long=True),
    "artifacts": Command("llmbook.alignment.shipped", "retrain Part V's and VI's shipped "
                         "artifacts (reward model, PPO, DPO, ...)", long=True),
    "scaling": Command("llmbook.training.scaling", "re-run chapter 11's iso-FLOP sweep "
                       "(about 9 minutes on 2 cores)", long=True),
    "quant-sweep": Command("llmbook.inference.real_quant", "re-run chapter 15's quantisation "
                           "sweep of the real model (about 10 minutes on 2 cores)", long=True),
    "bench": Command("llmbook.cli", "run a benchmark script of a source checkout "
                     "(benchmarks/NAME.py); without NAME, list them", long=True),
    "exercises": Command("llmbook.workbench.stubs", "write a chapter's exercise stub into "
                         "your workspace (./llmbook-work/); --list shows your status"),
    "grade": Command("llmbook.workbench.grader", "grade your answers to a chapter's exercises, "
                     "one row per exercise; --all for every chapter"),
}


def benchmarks() -> dict[str, Path]:
    """The benchmark scripts of the source checkout by name (empty for an installed wheel)."""
    from llmbook.paths import source_checkout

    root = source_checkout()
    if root is None:
        return {}
    return {p.stem: p for p in sorted((root / "benchmarks").glob("[a-z]*.py"))}


def _env(argv: Sequence[str]) -> int:
    """``llmbook env``: print the environment table and where the data and the model are."""
    parser = argparse.ArgumentParser(prog="llmbook env", description=COMMANDS["env"].summary)
    parser.parse_args(argv)
    import llmbook
    from llmbook.environment import environment_table
    from llmbook.paths import DATA_ENV, data_dir, source_checkout

    for row in environment_table():
        found = row.found or "missing"
        print(f"{'ok ' if row.ok else 'BAD'} {row.name:12s} {found:12s} (needs >= {row.required}: "
              f"{row.purpose})")
    print(f"llmbook {llmbook.__version__} from {Path(llmbook.__file__).parent}")
    checkout = source_checkout()
    print(f"source checkout: {checkout if checkout else 'none (an installed package)'}")
    print(f"data folder: {data_dir()} (set {DATA_ENV} to use another)")
    try:
        from llmbook.inference.gguf import smollm2_path

        print(f"real model: {smollm2_path()}")
    except (FileNotFoundError, ValueError) as err:
        print(f"real model: not usable: {err}")
    return 0


def _bench(argv: Sequence[str]) -> int:
    """``llmbook bench [NAME] [ARGS...]``: run ``benchmarks/NAME.py`` of the source checkout."""
    found = benchmarks()
    parser = argparse.ArgumentParser(
        prog="llmbook bench", description=COMMANDS["bench"].summary,
        epilog="benchmarks here: " + (", ".join(found) if found else
                                      "none (they live in a source checkout's benchmarks/)"))
    parser.add_argument("name", nargs="?", help="which benchmark; omit to list them")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed on to the script")
    args = parser.parse_args(argv)
    if args.name is None:
        if not found:
            print("no benchmarks: they live in a source checkout's benchmarks/ folder")
        for name, path in found.items():
            print(f"{name:12s} {path}")
        return 0
    if args.name not in found:
        parser.error(f"no benchmark named {args.name!r}; choose from {sorted(found)}")
    sys.argv = [str(found[args.name]), *args.args]
    runpy.run_path(str(found[args.name]), run_name="__main__")
    return 0


def _parser() -> argparse.ArgumentParser:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:{width}s}  {cmd.summary}{'  [long]' if cmd.long else ''}"
             for name, cmd in COMMANDS.items()]
    parser = argparse.ArgumentParser(
        prog="llmbook", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The command line of llmbook, the executable textbook on the mathematics "
                    "of large language models.",
        epilog="commands:\n" + "\n".join(lines) + "\n\n`llmbook COMMAND --help` shows a "
               "command's options and starts nothing; [long] commands take minutes.")
    parser.add_argument("command", nargs="?", choices=list(COMMANDS), metavar="COMMAND",
                        help="a command from the list below")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``llmbook [COMMAND [ARGS...]]``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "env":
        return _env(args.args)
    if args.command == "bench":
        return _bench(args.args)
    module = importlib.import_module(COMMANDS[args.command].module)
    status = module.main(list(args.args))
    return int(status or 0)


if __name__ == "__main__":
    raise SystemExit(main())
