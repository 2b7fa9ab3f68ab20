"""Benchmark: our byte-level BPE against Hugging Face ``tokenizers`` (notebooks/01_tokens).

Both tokenizers are trained on the same text (the shipped standard-library corpus,
about 1.3 MB) to the same vocabulary size, then encode that text. Prints a table and
writes ``benchmarks/results/bpe.json`` with the machine, the versions, the UTC date
and every number measured here.

    .venv/bin/python benchmarks/bpe.py [--vocab-size 2000] [--repeats 3]

Each time is the best of ``--repeats`` runs (the machine may be shared). ``tokenizers``
gets the text as one sequence, exactly as ours does, so both see the same pre-tokens;
its time with the text split into documents (so it can use several threads) is
reported as well, and so is its encoding of the documents as one batch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import tokenizers
import torch

from llmbook.nbtools import best_time
from llmbook.text.corpus import load_stdlib_docs, stdlib_docs_path
from llmbook.text.tokenizer import BPETokenizer, train_bpe, train_hf_bpe

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bpe.json"
SPECIALS = ["<|endoftext|>"]



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    text = load_stdlib_docs()
    n_bytes = len(text.encode("utf-8"))
    V = args.vocab_size
    docs = text.split("\n\n\n")

    t_train_ours, (vocab, merges) = best_time(lambda: train_bpe(text, V, SPECIALS), args.repeats)
    ours = BPETokenizer(vocab, merges, SPECIALS)
    t_train_hf, peer = best_time(lambda: train_hf_bpe(text, V, SPECIALS), args.repeats)
    t_train_hf_docs, _ = best_time(lambda: train_hf_bpe_docs(docs, V), args.repeats)

    def encode_ours_cold():
        ours._cache.clear()  # time the cold encoder: no pre-token cached yet
        return ours.encode(text)

    t_enc_ours, ids_ours = best_time(encode_ours_cold, args.repeats)
    t_enc_hf, enc_hf = best_time(lambda: peer.encode(text), args.repeats)
    ids_hf = enc_hf.ids
    t_enc_hf_docs, _ = best_time(lambda: peer.encode_batch(docs), args.repeats)
    assert ours.decode(ids_ours) == text, "round trip failed"

    ratio_ours, ratio_hf = n_bytes / len(ids_ours), n_bytes / len(ids_hf)
    result = {
        "benchmark": "byte-level BPE: llmbook.text.tokenizer vs Hugging Face tokenizers",
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "corpus": {"path": stdlib_docs_path().relative_to(ROOT).as_posix(),
                   "bytes": n_bytes, "characters": len(text)},
        "vocab_size": V,
        "special_tokens": SPECIALS,
        "repeats": args.repeats,
        "ours": {"train_s": t_train_ours, "encode_s": t_enc_ours,
                 "encode_MB_per_s": n_bytes / t_enc_ours / 1e6, "tokens": len(ids_ours),
                 "bytes_per_token": ratio_ours, "merges": len(merges)},
        "tokenizers": {"train_s": t_train_hf, "train_s_split_into_documents": t_train_hf_docs,
                       "encode_s": t_enc_hf, "encode_MB_per_s": n_bytes / t_enc_hf / 1e6,
                       "encode_s_batch_of_documents": t_enc_hf_docs,
                       "tokens": len(ids_hf), "bytes_per_token": ratio_hf},
        "ratios": {"train_time_ours_over_tokenizers": t_train_ours / t_train_hf,
                   "train_time_ours_over_tokenizers_split": t_train_ours / t_train_hf_docs,
                   "encode_time_ours_over_tokenizers": t_enc_ours / t_enc_hf,
                   "compression_relative_gap": ratio_ours / ratio_hf - 1},
        "goals": {"train_time_ratio_at_most": 20, "encode_MB_per_s_at_least": 1.0},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    print(f"corpus: {n_bytes / 1e6:.3f} MB, vocab size {V}, best of {args.repeats}")
    print(f"{'':22s}{'ours':>12s}{'tokenizers':>12s}")
    print(f"{'train (s)':22s}{t_train_ours:12.3f}{t_train_hf:12.3f}")
    print(f"{'encode (s)':22s}{t_enc_ours:12.3f}{t_enc_hf:12.3f}")
    print(f"{'encode (MB/s)':22s}{n_bytes / t_enc_ours / 1e6:12.2f}{n_bytes / t_enc_hf / 1e6:12.2f}")
    print(f"{'bytes per token':22s}{ratio_ours:12.4f}{ratio_hf:12.4f}")
    r = result["ratios"]
    print(f"train time ours / tokenizers: {r['train_time_ours_over_tokenizers']:.2f}x "
          f"(goal <= 20x; {r['train_time_ours_over_tokenizers_split']:.2f}x against tokenizers "
          f"given {len(docs)} documents, {t_train_hf_docs:.3f} s)")
    print(f"our encode throughput: {n_bytes / t_enc_ours / 1e6:.2f} MB/s (goal >= 1 MB/s); "
          f"tokenizers encoding {len(docs)} documents as a batch: "
          f"{n_bytes / t_enc_hf_docs / 1e6:.2f} MB/s")
    print(f"compression gap (ours / tokenizers - 1): {100 * r['compression_relative_gap']:+.2f}%")
    print(f"wrote {RESULTS}")
    return 0


def train_hf_bpe_docs(docs: list[str], vocab_size: int):
    """``tokenizers`` trained on the corpus split into documents (parallel counting)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(docs, trainer)
    return tok


if __name__ == "__main__":
    sys.exit(main())
