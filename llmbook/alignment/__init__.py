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
  response given a prompt, per-token entropy, masked sums, means and normalisation, and
  ``reduce_tokens``, the one reduction every loss's ``reduction=`` goes through (none, sum,
  token mean, sequence mean, constant; ``reduction_weights`` and the SymPy
  ``reduction_weights_symbolic`` give each token's weight, the source of the length bias).
* 17–19 the shared task → :mod:`~llmbook.alignment.preferences`: a known keyword reward on
  continuations by the book's text model, prompts from the corpus, Bradley–Terry
  preference pairs (shipped), and ``evaluate_policy`` (reward and KL of a policy).
* 17 SFT and reward models → :mod:`~llmbook.alignment.sft` (the prompt-masked loss from
  logits or from per-token log-probabilities, packing, the micro-batch step with gradient
  accumulation, the stop model that shows which lengths each reduction teaches) and
  :mod:`~llmbook.alignment.reward_model`.
* 17b chat templates and a real model → :mod:`~llmbook.alignment.chat_sft`: multi-turn
  conversations through SmolLM2's chat template with the loss on the assistant turns only
  (content and end-of-turn token), right-padded batches, and a LoRA fine-tune of SmolLM2
  equal to ``peft``'s (``lora_weights_as_peft``).
* 18 RLHF with PPO → :mod:`~llmbook.alignment.policy_gradient` (the theorem, checked exactly)
  and :mod:`~llmbook.alignment.ppo` (with ``sampler_logprobs``, the log-probabilities the
  sampler saw).
* 18b over-optimising a learned reward model → :mod:`~llmbook.alignment.overoptimisation`
  (best-of-n's KL log n - (n - 1)/n, derived, exact for a discrete policy and never above
  the formula; best-of-n for every n from one pool of samples; PPO and GRPO against chapter
  17's reward model as proxy; Gao et al.'s functional forms fitted; runs shipped in
  ``data/overoptimisation/``).
* 19 DPO → :mod:`~llmbook.alignment.dpo`; the preference-optimisation family →
  :mod:`~llmbook.alignment.preference_losses` (IPO, KTO, ORPO, SimPO, RLOO, each equal to
  trl's); the family trained on the book's task, side by side →
  :mod:`~llmbook.alignment.preference_training` (its runs shipped in
  ``data/preference_family/``).
* 19b Constitutional AI and RLAIF → :mod:`~llmbook.alignment.ai_feedback` (a model as judge,
  read from the logits of "A" and "B", in both orders; critique and revision; what label
  noise and position bias do to the Bradley–Terry target).
* 20 RL for reasoning and test-time compute → :mod:`~llmbook.alignment.reasoning` (the
  arithmetic task, GRPO), :mod:`~llmbook.alignment.rl_variants` (Dr. GRPO, DAPO, GSPO),
  :mod:`~llmbook.alignment.answers` (answer parsers, majority vote over responses, pass@k
  by enumeration) and :mod:`~llmbook.alignment.repeated_sampling` (majority vote, best-of-N).
* What Part V trains is shipped as files and loaded (:mod:`~llmbook.alignment.shipped`),
  so every reader sees the same results; ``make models`` retrains it.
* TRL as a peer → :mod:`~llmbook.alignment.trl_peer`: stand-ins that let a TRL trainer's own
  loss code run on tensors without a trainer (the tests' and the workbench's peer).

Imports Parts I–IV and the shared helpers, never a later part.
"""
