"""A real model's tokenizer, read from a GGUF file's metadata, and its chat template.

Introduced in notebooks/01_tokens (the GGUF container itself is chapter 15's,
:mod:`llmbook.inference.gguf_file`). A GGUF file written by llama.cpp carries its tokenizer
as metadata: for a byte-level BPE (``tokenizer.ggml.model = "gpt2"``) the tokens, written in
GPT-2's printable byte alphabet (:func:`~.pretokenize.bytes_to_unicode`, a space is ``Ġ``),
their types (1 normal, 3 control, 4 user-defined), the merges as ``"Ġ t"`` strings, the name
of the pre-tokeniser (``tokenizer.ggml.pre``), the ids of the BOS, EOS and padding tokens,
whether a BOS is added, and the chat template (a Jinja template).

:class:`ChatTokenizer` is :class:`~.encode.BPETokenizer` with those extras. Control tokens
(``<|im_start|>``, ``<|im_end|>``, ...) are special tokens: kept whole when they occur in the
text. :meth:`ChatTokenizer.render_chat` turns a conversation into the string the model was
fine-tuned on, by rendering the file's template with ``jinja2`` in a sandbox, set up as
Hugging Face ``transformers`` sets it up (blocks trimmed, a ``raise_exception`` function), so
that the string is the same byte for byte; :meth:`ChatTokenizer.encode_chat` encodes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llmbook.text.tokenizer.encode import BPETokenizer
from llmbook.text.tokenizer.pretokenize import gpt2_string_to_token
from llmbook.text.tokenizer.pretokenizers import PreTokenizer

__all__ = ["CHAT_ROLES", "GGUF_PRETOKENIZERS", "ChatTokenizer", "check_messages"]

#: llama.cpp's names (``tokenizer.ggml.pre``) -> the book's pre-tokeniser presets.
GGUF_PRETOKENIZERS = {"gpt-2": "gpt2", "smollm": "smollm", "qwen2": "qwen2"}
#: The roles a message may have.
CHAT_ROLES = ("system", "user", "assistant")
#: GGUF token types (llama.cpp's ``llama_token_type``) kept whole: control, user-defined.
_CONTROL, _USER_DEFINED = 3, 4


def check_messages(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """Validate a conversation and return a copy: a list of ``{"role": ..., "content": ...}``.

    Each message must be a dict with exactly the keys ``role`` (one of :data:`CHAT_ROLES`)
    and ``content`` (a ``str``); anything else is a ``TypeError`` or ``ValueError`` naming
    the message.
    """
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out = []
    for k, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{k}] must be a dict, got {type(message).__name__}")
        if set(message) != {"role", "content"}:
            raise ValueError(f"messages[{k}] must have exactly the keys 'role' and 'content', "
                             f"got {sorted(message)}")
        role, content = message["role"], message["content"]
        if role not in CHAT_ROLES:
            raise ValueError(f"messages[{k}]['role'] must be one of {list(CHAT_ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise TypeError(f"messages[{k}]['content'] must be a str, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def _raise_from_template(message: str) -> None:
    """The ``raise_exception`` function templates call to refuse a conversation."""
    raise ValueError(f"the chat template refused the conversation: {message}")


def _to_json(value: Any, indent: int | None = None) -> str:
    """The ``tojson`` filter: JSON with non-ASCII characters kept as they are."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _require(metadata: Mapping[str, Any], key: str, kind: type) -> Any:
    if key not in metadata:
        raise ValueError(f"the GGUF metadata has no {key!r}: not a tokenizer this reader knows")
    value = metadata[key]
    if not isinstance(value, kind):
        raise TypeError(f"GGUF metadata {key!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value


class ChatTokenizer(BPETokenizer):
    """A byte-level BPE with a model's special tokens, BOS/EOS ids and chat template.

    Args:
        vocab, merges, special_tokens, pretokenizer: as for :class:`~.encode.BPETokenizer`
            (here the vocabulary may lack single bytes that the model never saw).
        bos_token_id, eos_token_id, pad_token_id: the model's ids (``None`` if it has none).
        add_bos_token: whether :meth:`encode` puts the BOS id first.
        chat_template: the Jinja template of the model (``None``: :meth:`render_chat` raises).
        stop_token_ids: the ids that end an assistant turn; by default the EOS id and the
            ids of ``<|im_end|>``, ``<|endoftext|>`` and ``<|eot_id|>`` where they exist.

    Usually built with :meth:`from_gguf_metadata`. ``encode(text)`` gives a ``list[int]`` of
    length T; ``encode_chat(messages)`` the ids of the rendered conversation;
    ``encode_iterable`` (inherited) streams a text's ids and never adds a BOS.
    """

    def __init__(self, vocab: Mapping[int, bytes], merges: Sequence[tuple[bytes, bytes]],
                 special_tokens: Iterable[str] | None = None,
                 pretokenizer: str | PreTokenizer = "gpt2", *,
                 bos_token_id: int | None = None, eos_token_id: int | None = None,
                 pad_token_id: int | None = None, add_bos_token: bool = False,
                 chat_template: str | None = None,
                 stop_token_ids: Iterable[int] | None = None) -> None:
        super().__init__(vocab, merges, special_tokens, pretokenizer, require_all_bytes=False)
        for name, value in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id),
                            ("pad_token_id", pad_token_id)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value not in self.vocab):
                raise ValueError(f"{name} = {value!r} is not an id of the vocabulary "
                                 f"(V = {self.vocab_size})")
        if not isinstance(add_bos_token, bool):
            raise TypeError(f"add_bos_token must be a bool, got {add_bos_token!r}")
        if add_bos_token and bos_token_id is None:
            raise ValueError("add_bos_token=True needs a bos_token_id")
        if chat_template is not None and not isinstance(chat_template, str):
            raise TypeError(f"chat_template must be a str, got {type(chat_template).__name__}")
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos_token_id, eos_token_id, pad_token_id
        self.add_bos_token = add_bos_token
        self.chat_template = chat_template
        if stop_token_ids is None:
            named = [self._special_ids.get(s) for s in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")]
            stop_token_ids = [i for i in [eos_token_id, *named] if i is not None]
        stops = sorted(set(stop_token_ids))
        for i in stops:
            if i not in self.vocab:
                raise ValueError(f"stop token id {i!r} is not in the vocabulary")
        self.stop_token_ids: tuple[int, ...] = tuple(stops)
        self._template = None  # compiled on first use

    # -- from a GGUF file -------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> ChatTokenizer:
        """The tokenizer stored in a GGUF file's metadata (``read_gguf(path).metadata``).

        Reads ``tokenizer.ggml.tokens`` (GPT-2's byte alphabet; control and user-defined
        tokens, types 3 and 4 in ``tokenizer.ggml.token_type``, as plain text, kept whole),
        ``tokenizer.ggml.merges`` (``"left right"``), ``tokenizer.ggml.pre`` (one of
        :data:`GGUF_PRETOKENIZERS`), ``tokenizer.ggml.bos_token_id``, ``eos_token_id``,
        ``padding_token_id``, ``add_bos_token`` (absent: ``False``) and
        ``tokenizer.chat_template``. Only ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE)
        is supported; another model or pre-tokeniser is a ``ValueError`` that names it.
        """
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        model = _require(metadata, "tokenizer.ggml.model", str)
        if model != "gpt2":
            raise ValueError(f"tokenizer.ggml.model = {model!r}: only 'gpt2' (byte-level BPE) "
                             f"is supported")
        pre = _require(metadata, "tokenizer.ggml.pre", str)
        if pre not in GGUF_PRETOKENIZERS:
            raise ValueError(f"tokenizer.ggml.pre = {pre!r} is not supported; supported: "
                             f"{sorted(GGUF_PRETOKENIZERS)}")
        tokens = _require(metadata, "tokenizer.ggml.tokens", list)
        types = metadata.get("tokenizer.ggml.token_type", [1] * len(tokens))
        if len(types) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {len(types)} token types")
        vocab: dict[int, bytes] = {}
        specials = []
        for i, (tok, kind) in enumerate(zip(tokens, types, strict=True)):
            if not isinstance(tok, str):
                raise TypeError(f"token {i} must be a str, got {type(tok).__name__}")
            if kind in (_CONTROL, _USER_DEFINED):
                vocab[i] = tok.encode("utf-8")
                specials.append(tok)
            else:
                try:
                    vocab[i] = gpt2_string_to_token(tok)
                except ValueError as exc:
                    raise ValueError(f"token {i}: {exc}") from None
        merges = []
        for k, line in enumerate(_require(metadata, "tokenizer.ggml.merges", list)):
            parts = line.split(" ") if isinstance(line, str) else []
            if len(parts) != 2:
                raise ValueError(f"merge {k} must be two tokens separated by one space, got {line!r}")
            try:
                merges.append((gpt2_string_to_token(parts[0]), gpt2_string_to_token(parts[1])))
            except ValueError as exc:
                raise ValueError(f"merge {k}: {exc}") from None
        return cls(
            vocab, merges, specials, GGUF_PRETOKENIZERS[pre],
            bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
            pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
            add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=metadata.get("tokenizer.chat_template"))

    # -- encoding and decoding --------------------------------------------------------

    @property
    def special_token_ids(self) -> dict[str, int]:
        """Each special token's id, e.g. ``{"<|im_start|>": 1, ...}``."""
        return dict(self._special_ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (length T), the BOS id first if ``add_bos_token``.

        Special tokens in the text (``"<|im_start|>"``) become their ids. Text that needs a
        byte the vocabulary lacks (SmolLM2 lacks 21, such as U+0004) is a ``ValueError``.
        """
        ids = self._encode_text(text)
        return [self.bos_token_id, *ids] if self.add_bos_token else ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; with ``skip_special_tokens`` the special tokens are left out."""
        if skip_special_tokens:
            if isinstance(ids, str | bytes):
                raise TypeError(f"decode expects a list of ids, got {type(ids).__name__}")
            skip = set(self._special_ids.values())
            ids = [i for i in ids if i not in skip]
        return super().decode(ids)

    # -- chats --------------------------------------------------------------------------

    def _compiled_template(self):
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._template is None:
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[loopcontrols])
            env.globals["raise_exception"] = _raise_from_template
            env.filters["tojson"] = _to_json
            self._template = env.from_string(self.chat_template)
        return self._template

    def render_chat(self, messages: Sequence[Mapping[str, str]],
                    add_generation_prompt: bool = True) -> str:
        """The conversation as the string the model reads, from the file's chat template.

        ``messages`` is a list of ``{"role": "system" | "user" | "assistant", "content": str}``
        (:func:`check_messages`). With ``add_generation_prompt`` the string ends with the
        opening of an assistant turn, so that the model's next tokens are its answer.
        Equal byte for byte to ``transformers``' ``apply_chat_template(messages,
        tokenize=False, add_generation_prompt=...)`` (checked in the tests).
        """
        if not isinstance(add_generation_prompt, bool):
            raise TypeError(f"add_generation_prompt must be a bool, got {add_generation_prompt!r}")
        chat = check_messages(messages)
        names = {"bos_token": self.bos_token_id, "eos_token": self.eos_token_id,
                 "pad_token": self.pad_token_id}
        tokens = {k: self.vocab[i].decode("utf-8", errors="replace")
                  for k, i in names.items() if i is not None}
        return self._compiled_template().render(messages=chat,
                                                add_generation_prompt=add_generation_prompt,
                                                **tokens)

    def encode_chat(self, messages: Sequence[Mapping[str, str]],
                    add_generation_prompt: bool = True) -> list[int]:
        """The ids of :meth:`render_chat`'s string; no BOS is added (the template has its own)."""
        return self._encode_text(self.render_chat(messages, add_generation_prompt))
