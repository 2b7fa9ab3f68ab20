"""Byte-level BPE tokenization, written from scratch (chapter 1 of the book).

Introduced in notebooks/01_tokens. The modules, each adding one idea:

* :mod:`.pretokenize`: GPT-2's pre-tokenisation regex and its byte <-> unicode alphabet;
* :mod:`.pretokenizers`: :class:`PreTokenizer`, pre-tokenisation as a sequence of regex
  stages, and the presets ``"gpt2"``, ``"smollm"`` (digits apart first), ``"qwen2"``,
  ``"cl100k"``, ``"o200k"``;
* :mod:`.train`: :func:`train_bpe_naive` and :func:`train_bpe` (incremental pair counts);
* :mod:`.encode`: :class:`BPETokenizer` (encode, decode, streaming encode; any pre-tokeniser);
* :mod:`.gpt2_files`: GPT-2's ``encoder.json`` + ``vocab.bpe`` file pair;
* :mod:`.tiktoken_files`: tiktoken's rank files (Qwen's, cl100k_base, o200k_base) and the merges that
  the ranks determine (:func:`load_tiktoken_ranks`);
* :mod:`.chat`: :class:`ChatTokenizer`, a real model's tokenizer read from GGUF metadata,
  with its special tokens and chat template (SmolLM2-135M-Instruct's in the book);
* :mod:`.hf_peer`: Hugging Face ``tokenizers`` set up as the independent check;
* :mod:`.alternatives`: the other subword schemes' segmenters, WordPiece's greedy longest
  match and the Unigram model's Viterbi.
"""

from llmbook.text.tokenizer.alternatives import unigram_segment, wordpiece_segment
from llmbook.text.tokenizer.chat import ChatTokenizer, check_messages
from llmbook.text.tokenizer.encode import BPETokenizer
from llmbook.text.tokenizer.gpt2_files import read_gpt2_files, write_gpt2_files
from llmbook.text.tokenizer.hf_peer import (
    hf_tokenizer_from_bpe,
    train_hf_bpe,
    train_hf_unigram,
    train_hf_wordpiece,
)
from llmbook.text.tokenizer.pretokenize import (
    GPT2_SPLIT_PATTERN,
    bytes_to_unicode,
    gpt2_string_to_token,
    pretokenize,
    split_on_special_tokens,
    token_to_gpt2_string,
    unicode_to_bytes,
)
from llmbook.text.tokenizer.pretokenizers import (
    CL100K_SPLIT_PATTERN,
    O200K_SPLIT_PATTERN,
    PRETOKENIZERS,
    QWEN2_SPLIT_PATTERN,
    PreTokenizer,
    get_pretokenizer,
)
from llmbook.text.tokenizer.tiktoken_files import (
    load_tiktoken_ranks,
    merges_from_ranks,
    read_tiktoken_file,
)
from llmbook.text.tokenizer.train import (
    TIE_BREAKS,
    count_pairs,
    count_pretokens,
    load_text,
    merge_pair,
    train_bpe,
    train_bpe_naive,
)

__all__ = [
    "CL100K_SPLIT_PATTERN",
    "GPT2_SPLIT_PATTERN",
    "O200K_SPLIT_PATTERN",
    "PRETOKENIZERS",
    "QWEN2_SPLIT_PATTERN",
    "TIE_BREAKS",
    "BPETokenizer",
    "ChatTokenizer",
    "PreTokenizer",
    "bytes_to_unicode",
    "check_messages",
    "count_pairs",
    "count_pretokens",
    "get_pretokenizer",
    "gpt2_string_to_token",
    "hf_tokenizer_from_bpe",
    "load_text",
    "load_tiktoken_ranks",
    "merge_pair",
    "merges_from_ranks",
    "pretokenize",
    "read_gpt2_files",
    "read_tiktoken_file",
    "split_on_special_tokens",
    "token_to_gpt2_string",
    "train_bpe",
    "train_bpe_naive",
    "train_hf_bpe",
    "train_hf_unigram",
    "train_hf_wordpiece",
    "unicode_to_bytes",
    "unigram_segment",
    "wordpiece_segment",
    "write_gpt2_files",
]
