"""Decode SmolLM2-135M-Instruct under four rules for chapter 12; write data/real_decoding/runs.json.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_real_decoding.py     # about 2 minutes on a busy core

Section 12.9 ("Greedy decoding loops; sampling does not") compares what the real model
(``llmbook.inference.gguf.load_model``) writes after one plain-text prompt under greedy
decoding, greedy decoding with the repetition penalty 1.3, greedy decoding with no 3-gram
repeated, and four samples at T = 0.8 drawn as one batch from one seeded generator, 128
tokens each, all by ``llmbook.inference.sampling.generate`` with its KV cache on one thread.
That is 512 sequential decoding steps; checking them is four teacher-forced forward passes,
so the chapter loads the token ids written here and replays every run, checking that each
token is the one its rule picks with a margin no other CPU's round-off can overturn (a
stale file, another model or a changed sampler fails there). Writes ``runs.json``: the
recipe, the prompt's ids, each run's new token ids, the seconds each run took, the command,
date and machine.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch

from llmbook.inference.gguf import load_model
from llmbook.inference.sampling import generate
from llmbook.paths import data_path
from llmbook.training.pretrained import machine_facts, write_json

#: What chapter 12 states and checks against the shipped file.
RECIPE = {
    "prompt": "The best thing about living by the sea is",
    "max_new_tokens": 128,
    "greedy_rules": {"greedy": {}, "greedy + penalty 1.3": {"repetition_penalty": 1.3},
                     "greedy + no 3-gram twice": {"no_repeat_ngram_size": 3}},
    "samples": {"batch": 4, "temperature": 0.8, "seed": 0},
}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    torch.set_num_threads(1)  # as in the chapter
    model, tokenizer = load_model()
    prompt_ids = torch.tensor([tokenizer.encode(RECIPE["prompt"])])  # (1, T0)
    T0, n = prompt_ids.shape[1], RECIPE["max_new_tokens"]
    runs, seconds = {}, {}
    for name, rule in RECIPE["greedy_rules"].items():
        began = time.perf_counter()
        runs[name] = generate(model, prompt_ids, n, temperature=0, **rule)[0, T0:].tolist()
        seconds[name] = round(time.perf_counter() - began, 2)
        print(f"{name}: {seconds[name]} s", flush=True)
    s = RECIPE["samples"]
    began = time.perf_counter()
    samples = generate(model, prompt_ids.expand(s["batch"], -1), n, temperature=s["temperature"],
                       generator=torch.Generator().manual_seed(s["seed"]))[:, T0:].tolist()
    seconds["samples"] = round(time.perf_counter() - began, 2)
    print(f"samples: {seconds['samples']} s", flush=True)
    info = {"recipe": RECIPE, "prompt_ids": prompt_ids[0].tolist(), "runs": runs, "samples": samples,
            "seconds": seconds,
            "made": {"command": "python data/make_real_decoding.py",
                     "date": datetime.date.today().isoformat(), **machine_facts()}}
    write_json(data_path("real_decoding", "runs.json"), info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
