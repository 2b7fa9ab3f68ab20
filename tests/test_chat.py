"""``python -m llmbook.chat``: the terminal chat with the real model (llmbook.chat)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch

from llmbook.chat import main, reply
from llmbook.inference.gguf import load_model


@pytest.fixture(scope="module")
def smol():
    return load_model()


def test_reply_streams_the_text_it_returns(smol):
    model, tokenizer = smol
    pieces: list[str] = []
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    text = reply(model, tokenizer, chat, temperature=0, max_new_tokens=20, on_text=pieces.append)
    assert text == "The capital of France is Paris."
    assert "".join(pieces).strip() == text and len(pieces) > 3


def test_seeded_sampling_is_repeatable(smol):
    model, tokenizer = smol
    chat = [{"role": "user", "content": "Say something about the sea."}]
    a, b = (reply(model, tokenizer, chat, temperature=1.0, top_p=0.9, max_new_tokens=12,
                  generator=torch.Generator().manual_seed(3)) for _ in range(2))
    assert a == b and a


def test_one_prompt_from_the_command_line():
    out = io.StringIO()
    assert main(["--prompt", "What is the capital of France?", "--temperature", "0",
                 "--max-new-tokens", "16"], stdout=out) == 0
    assert out.getvalue().strip() == "The capital of France is Paris."


def test_a_conversation_remembers_and_forgets():
    stdin = io.StringIO("What is the capital of France?\nAnd of Italy?\n/reset\n/quit\n")
    out = io.StringIO()
    assert main(["--temperature", "0", "--max-new-tokens", "16"], stdin=stdin, stdout=out) == 0
    text = out.getvalue()
    assert "smollm> The capital of France is Paris." in text
    assert "Rome" in text  # "And of Italy?" is understood only with the first turn
    assert "(conversation forgotten)" in text


def test_the_fast_path_answers_too():
    out = io.StringIO()
    main(["--prompt", "What is the capital of France?", "--temperature", "0", "--fast",
          "--max-new-tokens", "16"], stdout=out)
    assert "Paris" in out.getvalue()


def test_help_names_the_sampling_options():
    result = subprocess.run([sys.executable, "-m", "llmbook.chat", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0
    for option in ("--temperature", "--top-p", "--top-k", "--min-p", "--seed", "--fast",
                   "--compile"):
        assert option in result.stdout


def test_a_full_context_is_a_clear_error(smol):
    model, tokenizer = smol
    long = [{"role": "user", "content": "word " * 9000}]
    with pytest.raises(ValueError, match="context"):
        reply(model, tokenizer, long, max_new_tokens=4)
