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
* 23 Beyond attention → :mod:`~llmbook.scale.linear_attention`, :mod:`~llmbook.scale.ssm`,
  :mod:`~llmbook.scale.rwkv`.
* 24 In-context learning and induction heads → :mod:`~llmbook.scale.induction`,
  :mod:`~llmbook.scale.interpretability`.

Imports Parts I–V and the shared helpers, never a later part.
"""
