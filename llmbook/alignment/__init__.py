"""Part V, adaptation and alignment (chapters 16–20): LoRA, SFT, reward models, PPO, DPO, GRPO.

Chapter → module → what it defines:

* 16 LoRA → :mod:`~llmbook.alignment.lora`: ``LoRALinear`` (ΔW = (α/r)·B·A with B = 0 at
  start), ``apply_lora``, merging and unmerging, parameter and memory counts.
* 17–20 the objectives → :mod:`~llmbook.alignment.losses`: the Bradley–Terry reward-model
  loss, the DPO and IPO losses, the PPO clipped policy and value losses, GAE, the
  policy-gradient loss, group-normalised rewards and the GRPO loss, the k1/k2/k3 KL
  estimators; :mod:`~llmbook.alignment.logprobs`: per-token log-probabilities of a
  response given a prompt, per-token entropy, masked sums, means and normalisation.

Imports Parts I–IV and the shared helpers, never a later part.
"""
