"""Fine-tune SmolLM2-135M-Instruct with LoRA on chapter 17b's pirate chats, and again with peft; write data/chat_finetuning/.

    OMP_NUM_THREADS=1 .venv/bin/python data/make_chat_finetuning.py    # about 1 minute on a quiet core (3 on a busy one)

The recipe is ``llmbook.alignment.chat_sft.LORA_RECIPE`` (rank-4 adapters on W_q and W_v,
8 AdamW steps at learning rate 2e-3) and the data ``pirate_chats()`` (four two-turn
conversations, loss on the assistant turns only). The same run is made twice:

* by the book: ``load_model()``, ``add_adapters``, ``sft_loss`` on ``collate_chats``'s batch;
* by the peers: ``transformers``' own GGUF loader and Llama (``transformers_peer()``), wrapped
  by ``peft``'s ``get_peft_model`` with the book's initial adapters copied in
  (``lora_weights_as_peft``), the loss from ``model(input_ids, labels=hf_labels(batch))``.

Writes ``results.json`` (the recipe; both loss trajectories and their largest difference;
the difference between the trained adapters, largest and relative (Frobenius), and how many
entries lie more than one learning rate apart; ``transformers``' token ids and
assistant masks of the four conversations, from ``apply_chat_template`` with
``SMOLLM2_TRAINING_TEMPLATE``; seconds per step; the machine) and ``adapters.safetensors``
(the book's trained adapters, float32, 0.9 MB), which the chapter loads to show the replies
before and after. Another CPU gives the same numbers to about 1e-6.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import warnings

import torch
from safetensors.torch import save_file

from llmbook.alignment.chat_sft import (
    LORA_RECIPE,
    SMOLLM2_TRAINING_TEMPLATE,
    add_adapters,
    collate_chats,
    encode_chat_example,
    hf_labels,
    lora_weights_as_peft,
    pirate_chats,
    train_adapters,
)
from llmbook.alignment.lora import lora_state_dict
from llmbook.alignment.sft import sft_loss
from llmbook.inference.gguf import load_model, transformers_peer
from llmbook.paths import data_path
from llmbook.training.pretrained import machine_facts


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(1)
    recipe, chats = LORA_RECIPE, pirate_chats()
    model, tokenizer = load_model()
    batch = collate_chats([encode_chat_example(tokenizer, c) for c in chats], tokenizer.pad_token_id)
    params = add_adapters(model, recipe)
    initial = lora_weights_as_peft(model, model.config.d_head)
    began = time.perf_counter()
    book = train_adapters(lambda: sft_loss(model(batch.ids), batch.targets, batch.loss_mask),
                          params, recipe["steps"], recipe["lr"])
    book_seconds = (time.perf_counter() - began) / recipe["steps"]
    print("book ", [round(x, 5) for x in book], f"{book_seconds:.2f} s/step", flush=True)

    hf, hf_tokenizer = transformers_peer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # peft 0.21 on transformers 5
        peer = get_peft_model(hf, LoraConfig(r=recipe["r"], lora_alpha=recipe["alpha"],
                                             target_modules=recipe["target_modules"],
                                             lora_dropout=0.0))
    missing = peer.load_state_dict(initial, strict=False)
    assert not missing.unexpected_keys, missing.unexpected_keys
    labels = hf_labels(batch)
    began = time.perf_counter()
    theirs = train_adapters(lambda: peer(input_ids=batch.ids, labels=labels).loss,
                            [p for p in peer.parameters() if p.requires_grad], recipe["steps"],
                            recipe["lr"])
    peer_seconds = (time.perf_counter() - began) / recipe["steps"]
    print("peft ", [round(x, 5) for x in theirs], f"{peer_seconds:.2f} s/step", flush=True)
    trained = lora_weights_as_peft(model, model.config.d_head)
    peft_weights = dict(peer.named_parameters())
    weight_diff = max((trained[k] - peft_weights[k]).abs().max().item() for k in trained)
    weight_size = max(v.abs().max().item() for v in trained.values())
    squares = sum(((trained[k] - peft_weights[k]) ** 2).sum().item() for k in trained)
    relative = (squares / sum((peft_weights[k] ** 2).sum().item() for k in trained)) ** 0.5
    moved = sum(int(((trained[k] - peft_weights[k]).abs() > recipe["lr"]).sum()) for k in trained)

    peer_chats = []
    for chat in chats:
        out = hf_tokenizer.apply_chat_template(chat, chat_template=SMOLLM2_TRAINING_TEMPLATE,
                                               tokenize=True, return_dict=True,
                                               return_assistant_tokens_mask=True)
        peer_chats.append({"input_ids": list(out["input_ids"]),
                           "assistant_masks": list(out["assistant_masks"])})

    folder = data_path("chat_finetuning")
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in lora_state_dict(model).items()},
              folder / "adapters.safetensors")
    info = {"recipe": recipe, "chats": chats,
            "losses": {"book": book, "peft": theirs},
            "max_loss_difference": max(abs(a - b) for a, b in zip(book, theirs, strict=True)),
            "max_adapter_difference": weight_diff, "max_adapter_entry": weight_size,
            "adapter_relative_difference": relative,
            "adapter_entries_apart_by_more_than_lr": moved,
            "adapter_entries": sum(v.numel() for v in trained.values()),
            "seconds_per_step": {"book": book_seconds, "peft": peer_seconds},
            "transformers_chats": peer_chats,
            "made": {"command": "python data/make_chat_finetuning.py",
                     "date": datetime.date.today().isoformat(), **machine_facts()}}
    (folder / "results.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"loss difference {info['max_loss_difference']:.2e}, adapter difference "
          f"{weight_diff:.2e} (largest entry {weight_size:.3f}; relative {relative:.2e}; "
          f"{moved} of {info['adapter_entries']} entries apart by more than lr)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
