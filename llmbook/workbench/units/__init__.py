"""The build-it-yourself track: one unit per Part of the book, the Part's core written by the reader.

Each module ``buildN_slug`` is a unit's reference, the book's own implementations plugged in:
one public function (or class) per thing the reader builds, whose docstring is the task
(what to compute, shapes, hints, the peer it is graded against) and whose body calls the
code the chapters build. ``llmbook exercises build-II`` writes the stub generated from it
(:mod:`llmbook.workbench.stubs`), and ``llmbook grade build-II`` runs the unit's checks
(``llmbook/workbench/checks/build2.py``) on the reader's file: the book's checks against the
peers the chapters already use, and one end-to-end check at the end.

* ``build1_tokenizer`` — Part I: GPT-2's pre-tokenisation, pair counts and a merge, the BPE
  trainer, encoder and decoder (= the book's tokenizer, ``tokenizers``, ``tiktoken``).
* ``build2_transformer`` — Part II: softmax, masked attention, RoPE, RMSNorm, SwiGLU, a
  decoder block with grouped-query attention (= ``torch``, ``transformers``' Llama layers);
  end to end, SmolLM2-135M with the reader's block in every layer.
* ``build3_training`` — Part III: cross-entropy and its gradient by hand, a linear layer's
  backward pass, clipping, the warmup-cosine schedule, AdamW (= ``torch.optim.AdamW`` step
  for step); end to end, ten training steps of a small transformer.
* ``build4_inference`` — Part IV: temperature, top-k and top-p (= ``transformers``' warpers),
  a KV cache (= recomputation), absmax int8 and NF4; end to end, the book's text model
  decoded, sampled and quantised with the reader's code.
* ``build5_alignment`` — Part V: completion log-probabilities, the DPO loss, GAE, PPO's
  clipped loss (= TRL, torchrl and the book's losses); end to end, three DPO steps.
* ``build6_distributed`` — Part VI: a ring reduce-scatter, all-gather and all-reduce on gloo
  (= ``torch.distributed.all_reduce``); end to end, data-parallel training.

Nothing in the book imports these modules; the grader loads them by path.
"""
