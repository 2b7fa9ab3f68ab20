"""Part VI, scale and beyond (chapters 21–24): mixture of experts, distributed training,
alternatives to attention, in-context learning.

Chapter → module → what it defines:

* 21 Mixture of experts → :mod:`~llmbook.scale.moe`, :mod:`~llmbook.scale.moe_training`.
* 22 Distributed training → :mod:`~llmbook.scale.launch`, :mod:`~llmbook.scale.collectives`,
  :mod:`~llmbook.scale.data_parallel`, :mod:`~llmbook.scale.zero`,
  :mod:`~llmbook.scale.mixed_precision`, :mod:`~llmbook.scale.tensor_parallel`,
  :mod:`~llmbook.scale.pipeline`, :mod:`~llmbook.scale.cost_model`. (``mixed_precision``
  re-exports the loss scaler and master-weight optimiser that chapter 10 introduces in
  :mod:`llmbook.training.memory`.)
* 22b Context parallelism → :mod:`~llmbook.scale.context_parallel` (ring attention, zig-zag
  sharding, Ulysses all-to-all).
* 22c Expert parallelism → :mod:`~llmbook.scale.expert_parallel` (all-to-all dispatch and
  combine of chapter 21's MoE layer over ranks, capacity across ranks, bytes per step).
* 22d PyTorch's own parallelisms as peers → :mod:`~llmbook.scale.torch_peers` (the book's
  TP, PP and ZeRO-1/2 trained beside ``parallelize_module``, ``torch.distributed.pipelining``
  and ``ZeroRedundancyOptimizer``), :mod:`~llmbook.scale.sharded` (a ZeRO-3 module wrapper
  driven by any torch optimizer, with a separate compute dtype, beside ``fully_shard``).
* 23 Beyond attention → :mod:`~llmbook.scale.linear_attention`, :mod:`~llmbook.scale.ssm`,
  :mod:`~llmbook.scale.rwkv`.
* 23b Mamba-2 and state-space duality → :mod:`~llmbook.scale.ssd`, :mod:`~llmbook.scale.mamba2`.
* 24 In-context learning and induction heads → :mod:`~llmbook.scale.induction`,
  :mod:`~llmbook.scale.interpretability`, :mod:`~llmbook.scale.icl` (a linear self-attention
  layer that is one step of gradient descent on in-context regression).
* 24b Interpretability on SmolLM2-135M-Instruct (logit lens, head scores, activation patching,
  the FFN as a key-value memory, the basis question) → :mod:`~llmbook.scale.interpretability`.

Imports Parts I–V and the shared helpers, never a later part.
"""
