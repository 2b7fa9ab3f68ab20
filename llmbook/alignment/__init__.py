"""Part V, adaptation and alignment (chapters 16–20): LoRA, SFT, reward models, PPO, DPO, GRPO.

Chapter → module → what it defines:

* 16 LoRA → :mod:`~llmbook.alignment.lora`: ``LoRALinear`` (ΔW = (α/r)·B·A with B = 0 at
  start), ``apply_lora``, merging and unmerging, parameter and memory counts,
  ``quantize_frozen_nf4`` (the 4-bit base of QLoRA); rsLoRA (``use_rslora``,
  ``lora_scaling``), LoRA+ (``loraplus_param_groups``) and DoRA (``use_dora``).
* 17–20 the objectives → :mod:`~llmbook.alignment.losses`: the Bradley–Terry reward-model
  loss, the DPO and IPO losses, the PPO clipped policy and value losses, GAE, the
  policy-gradient loss, group-normalised rewards and the GRPO loss, the k1/k2/k3 KL
  estimators, what their gradients estimate as losses and their exact variances
  (``kl_estimator_loss_gradients``, ``kl_estimator_variances``);
  :mod:`~llmbook.alignment.logprobs`: per-token log-probabilities of a
  response given a prompt, per-token entropy, masked sums, means and normalisation.
* 17–19 the shared task → :mod:`~llmbook.alignment.preferences`: a known keyword reward on
  continuations by the book's text model, prompts from the corpus, Bradley–Terry
  preference pairs (shipped), and ``evaluate_policy`` (reward and KL of a policy).
* 17 SFT and reward models → :mod:`~llmbook.alignment.sft` (the prompt-masked loss, packing,
  the micro-batch step with gradient accumulation) and :mod:`~llmbook.alignment.reward_model`.
* 18 RLHF with PPO → :mod:`~llmbook.alignment.policy_gradient` (the theorem, checked exactly)
  and :mod:`~llmbook.alignment.ppo` (with ``sampler_logprobs``, the log-probabilities the
  sampler saw).
* 19 DPO → :mod:`~llmbook.alignment.dpo`; the preference-optimisation family →
  :mod:`~llmbook.alignment.preference_losses` (IPO, KTO, ORPO, SimPO, RLOO, each equal to
  trl's).
* 20 RL for reasoning and test-time compute → :mod:`~llmbook.alignment.reasoning` (the
  arithmetic task, GRPO), :mod:`~llmbook.alignment.rl_variants` (Dr. GRPO, DAPO, GSPO),
  :mod:`~llmbook.alignment.answers` (answer parsers, majority vote over responses, pass@k
  by enumeration) and :mod:`~llmbook.alignment.repeated_sampling` (majority vote, best-of-N).
* What Part V trains is shipped as files and loaded (:mod:`~llmbook.alignment.shipped`),
  so every reader sees the same results; ``make models`` retrains it.

Imports Parts I–IV and the shared helpers, never a later part.
"""
