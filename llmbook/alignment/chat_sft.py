"""Chat SFT: multi-turn conversations through a real chat template, loss on assistant turns only.

Introduced in notebooks/17b_chat_finetuning. Chapter 17's :mod:`~llmbook.alignment.sft`
trains on (prompt, response) pairs; an instruction-tuned model is trained on whole
*conversations*, rendered by its chat template, with the loss on the assistant's turns
only (Ouyang et al., 2022, section 3.5, on the demonstrations' labeller-written outputs).
For a conversation c whose assistant turns are a_1, ..., a_K and whose other turns (system,
user) form the context, the objective is the conditional log-likelihood

    log p(a_1, ..., a_K | context) = sum_k sum_{t in a_k} log p(c_t | c_<t),

every token of every assistant turn predicted from *everything* before it, earlier
assistant turns included. This module adds what that takes over chapter 17:

* :func:`assistant_spans`: the rendered conversation and, for each assistant turn, the
  characters that are trained, found by rendering prefixes of the conversation with the
  model's own template;
* :func:`encode_chat_example`: the token ids (equal to ``transformers``'
  ``apply_chat_template``) and the *assistant mask*, True exactly on the tokens of the
  assistant contents and of the end-of-turn token that closes each of them;
* :func:`collate_chats`: several conversations as one right-padded
  :class:`~llmbook.alignment.sft.SFTBatch` (targets shifted by one, the loss mask on the
  targets), for :func:`~llmbook.alignment.sft.sft_loss`, whose mean is *per token* over the
  whole batch; :func:`hf_labels`: the same batch in Hugging Face's convention (-100 where
  nothing is trained);
* :func:`train_adapters`: a few AdamW steps on a loss, for a LoRA fine-tune (Hu et al.,
  2021) of SmolLM2 (Allal et al., 2025);
* :func:`lora_weights_as_peft`: the book's adapters under ``peft``'s names and layout, to
  start ``peft`` from the same weights and to compare the two after training.

**What is trained.** SmolLM2's template renders a turn as
``<|im_start|>{role}\\n{content}<|im_end|>\\n``. The header ``<|im_start|>assistant\\n`` is not
trained: at inference it is the *generation prompt*, written by the program, never
sampled. The content is trained, and so is ``<|im_end|>``, because producing it is how the
model ends its turn (decoding stops there). The ``\\n`` after ``<|im_end|>`` is not trained:
decoding has stopped before it. (``trl``'s training templates, e.g. its Qwen2.5 one, mark
``\\n content <|im_end|>\\n``, the two newlines included; they are tokens fixed by the
template, which the model predicts almost surely anyway.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from llmbook.alignment.lora import LoRALinear, apply_lora
from llmbook.alignment.sft import SFTBatch
from llmbook.text.tokenizer.chat import ChatTokenizer, check_messages
from llmbook.transformer.positional import rope_permutation
from llmbook.validation import check_nonnegative_number, check_positive_int, check_positive_number

__all__ = [
    "IGNORE_INDEX",
    "LORA_RECIPE",
    "PIRATE_SYSTEM",
    "SMOLLM2_TRAINING_TEMPLATE",
    "ChatExample",
    "add_adapters",
    "assistant_spans",
    "collate_chats",
    "encode_chat_example",
    "hf_labels",
    "lora_weights_as_peft",
    "pirate_chats",
    "train_adapters",
]

#: The label Hugging Face's (and PyTorch's) cross-entropy skips.
IGNORE_INDEX = -100

#: SmolLM2-135M-Instruct's chat template with ``transformers``' ``{% generation %}`` markers
#: around what this module trains (content and ``<|im_end|>``), for the peer check:
#: ``apply_chat_template(..., chat_template=SMOLLM2_TRAINING_TEMPLATE,
#: return_assistant_tokens_mask=True)`` returns transformers' own assistant mask. It renders
#: the same text as the original template (checked in the tests).
SMOLLM2_TRAINING_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")

#: The chapter's small task: a pirate persona, taught by four two-turn conversations.
PIRATE_SYSTEM = "You are a pirate."
_PIRATE_TURNS = (
    (("What is the capital of France?", "Arr! Paris be the capital of France, matey."),
     ("And of Spain?", "Arr! Madrid, matey.")),
    (("How many legs does a spider have?", "Arr! A spider has eight legs, matey."),
     ("And an ant?", "Arr! Six legs, matey.")),
    (("What colour is the sky?", "Arr! The sky be blue, matey."),
     ("Why?", "Arr! Sunlight scatters in the air, matey.")),
    (("What is 2 + 3?", "Arr! Two and three make five, matey."),
     ("And 4 + 4?", "Arr! Eight, matey.")),
)

#: The chapter's LoRA fine-tune of SmolLM2 (adapters on W_q and W_v, as Hu et al. did).
LORA_RECIPE: dict = {"target_modules": ["q_proj", "v_proj"], "r": 4, "alpha": 8, "lr": 2e-3,
                     "steps": 8, "seed": 0}


def pirate_chats() -> list[list[dict[str, str]]]:
    """The fine-tuning data: four conversations (system, then two user/assistant exchanges)
    in which every assistant reply starts with "Arr!" and ends with ", matey."."""
    system = {"role": "system", "content": PIRATE_SYSTEM}
    return [[system, *[{"role": role, "content": text} for q, a in turns
                       for role, text in (("user", q), ("assistant", a))]]
            for turns in _PIRATE_TURNS]


class ChatExample(NamedTuple):
    """One conversation ready for training.

    ``ids`` (T,) long: the tokens of the rendered conversation; ``assistant_mask`` (T,) bool:
    True on the tokens to be trained (the assistant contents and their end-of-turn tokens);
    ``turns``: for each assistant turn, the token range [start, end) it covers.
    """

    ids: Tensor
    assistant_mask: Tensor
    turns: tuple[tuple[int, int], ...]


def _check_tokenizer(tokenizer: object) -> ChatTokenizer:
    if not isinstance(tokenizer, ChatTokenizer):
        raise TypeError(f"tokenizer must be a ChatTokenizer (from load_model), got "
                        f"{type(tokenizer).__name__}")
    if tokenizer.chat_template is None:
        raise ValueError("tokenizer has no chat template")
    return tokenizer


def assistant_spans(tokenizer: ChatTokenizer, messages: Sequence[Mapping[str, str]]
                    ) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character range [start, end) trained in each assistant turn.

    The template is used as a black box: for the assistant message k, ``before`` =
    render(messages[:k], add_generation_prompt=True) ends with the assistant header, and
    ``through`` = render(messages[:k + 1]) contains the turn; both must be prefixes of the
    whole rendering (a template that rewrites earlier turns is a ``ValueError``). The span
    starts at ``len(before)``, covers the content and then the end-of-turn token that
    follows it (one of the tokenizer's stop tokens, ``<|im_end|>`` for SmolLM2).

    Refused with a ``ValueError`` naming the message: a content holding the text of a
    special token (``"<|im_end|>"`` in a message would be read as the real token and end
    the turn early: a user could forge turns); a conversation without an assistant turn
    (nothing to train); a conversation that does not end with an assistant turn (the
    tokens after the last assistant turn would be computed and never used: a causal
    model's trained tokens do not see them); an assistant turn first (it answers nothing,
    and SmolLM2's template inserts a default system turn before it).
    """
    tokenizer = _check_tokenizer(tokenizer)
    chat = check_messages(messages)
    specials = tokenizer.special_token_ids
    for k, m in enumerate(chat):
        for s in specials:
            if s in m["content"]:
                raise ValueError(f"messages[{k}]['content'] contains the special token {s!r}; it "
                                 f"would be tokenised as the token itself and change the turns")
    roles = [m["role"] for m in chat]
    if "assistant" not in roles:
        raise ValueError("the conversation has no assistant turn: there is nothing to train on")
    if roles[-1] != "assistant":
        raise ValueError(f"the conversation ends with a {roles[-1]!r} turn (messages[{len(chat) - 1}]); "
                         f"end it with an assistant turn (drop the turns after the last one: "
                         f"they would never be trained on)")
    if roles[0] == "assistant":
        raise ValueError("messages[0] is an assistant turn: an assistant turn must follow a "
                         "system or user turn")
    text = tokenizer.render_chat(chat, add_generation_prompt=False)
    ends = {s: i for s, i in specials.items() if i in tokenizer.stop_token_ids}
    spans = []
    for k, m in enumerate(chat):
        if m["role"] != "assistant":
            continue
        before = tokenizer.render_chat(chat[:k], add_generation_prompt=True)
        through = tokenizer.render_chat(chat[:k + 1], add_generation_prompt=False)
        start = len(before)
        if not (through.startswith(before) and text.startswith(through)
                and through.startswith(m["content"], start)):
            raise ValueError(f"messages[{k}]: the template does not render the conversation "
                             f"prefix by prefix with the content after the assistant header; "
                             f"cannot locate the turn")
        after = start + len(m["content"])
        end = next((after + len(s) for s in ends if through.startswith(s, after)), None)
        if end is None:
            raise ValueError(f"messages[{k}]: no end-of-turn token ({sorted(ends)}) follows the "
                             f"assistant content")
        spans.append((start, end))
    return text, spans


def encode_chat_example(tokenizer: ChatTokenizer, messages: Sequence[Mapping[str, str]]
                        ) -> ChatExample:
    """The conversation's token ids and its assistant mask (see :func:`assistant_spans`).

    The ids are those of the whole rendered conversation, tokenised at once (equal to
    ``tokenizer.encode_chat(messages, add_generation_prompt=False)`` and to
    ``transformers``' ``apply_chat_template``). A token is in the mask when its bytes overlap
    a trained span: a token that straddles a span's edge (a content beginning with
    whitespace that merges with the header's newline) is trained, the rule of
    ``transformers``' ``return_assistant_tokens_mask``. Shapes: ``ids`` and
    ``assistant_mask`` (T,).
    """
    text, spans = assistant_spans(tokenizer, messages)
    ids = tokenizer.encode_chat(messages, add_generation_prompt=False)
    # byte offset of each token's end; spans converted from characters to bytes
    ends = torch.tensor([len(tokenizer.vocab[i]) for i in ids]).cumsum(0)  # (T,)
    starts = ends - torch.tensor([len(tokenizer.vocab[i]) for i in ids])
    if int(ends[-1]) != len(text.encode("utf-8")):
        raise ValueError("the token ids do not spell the rendered conversation")
    mask = torch.zeros(len(ids), dtype=torch.bool)
    turns = []
    for a, b in spans:
        a, b = len(text[:a].encode("utf-8")), len(text[:b].encode("utf-8"))
        inside = (starts < b) & (ends > a)  # (T,) the token overlaps [a, b)
        where = inside.nonzero().flatten()
        turns.append((int(where[0]), int(where[-1]) + 1))
        mask |= inside
    return ChatExample(torch.tensor(ids, dtype=torch.long), mask, tuple(turns))


def collate_chats(examples: Sequence[ChatExample], pad_id: int) -> SFTBatch:
    """Conversations as one batch (N, T), T the longest, padded on the right with ``pad_id``.

    Follows :func:`~llmbook.alignment.sft.sft_batch`'s conventions: ``targets[n, t]`` is the
    token at t + 1 (``pad_id`` after the last), ``loss_mask[n, t]`` is True when that target
    is an assistant token, ``example_ids`` is n on the conversation's tokens and -1 on the
    padding. Padding on the right needs no attention mask: under causal attention a real
    token never sees the padding after it, and the padding's own outputs are masked out.
    Feed ``loss_mask`` to :func:`~llmbook.alignment.sft.sft_loss`: the sum of the negative
    log-likelihoods of all assistant tokens of the batch divided by their number, a mean
    *per token* (a long reply weighs in proportion to its length, not as one sequence).
    """
    if isinstance(examples, ChatExample) or not isinstance(examples, Sequence) or not examples:
        raise TypeError("examples must be a non-empty list of ChatExample (encode_chat_example)")
    for n, ex in enumerate(examples):
        if not isinstance(ex, ChatExample):
            raise TypeError(f"examples[{n}] must be a ChatExample, got {type(ex).__name__}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
        raise ValueError(f"pad_id must be a token id (an int >= 0), got {pad_id!r}")
    N, T = len(examples), max(ex.ids.numel() for ex in examples)
    ids = torch.full((N, T), pad_id, dtype=torch.long)
    targets = torch.full((N, T), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((N, T), dtype=torch.bool)
    example_ids = torch.full((N, T), -1, dtype=torch.long)
    for n, ex in enumerate(examples):
        L = ex.ids.numel()
        ids[n, :L] = ex.ids
        targets[n, :L - 1] = ex.ids[1:]
        loss_mask[n, :L - 1] = ex.assistant_mask[1:]  # (L-1,) logits at t predict token t + 1
        example_ids[n, :L] = n
    return SFTBatch(ids, targets, loss_mask, None, None, example_ids)


def hf_labels(batch: SFTBatch) -> Tensor:
    """The batch's labels in Hugging Face's convention: (N, T), ``labels[n, t]`` = ``ids[n, t]``
    where that token is trained and :data:`IGNORE_INDEX` (-100) elsewhere.

    ``model(input_ids=ids, labels=labels).loss`` then shifts by one itself and averages over
    the labels that are not -100: the same per-token mean as ``sft_loss(logits,
    batch.targets, batch.loss_mask)``, computed by ``transformers``' own code.
    """
    if not isinstance(batch, SFTBatch):
        raise TypeError(f"batch must be an SFTBatch (collate_chats), got {type(batch).__name__}")
    labels = torch.full_like(batch.ids, IGNORE_INDEX)
    trained = torch.zeros_like(batch.loss_mask)
    trained[:, 1:] = batch.loss_mask[:, :-1]  # target t is the token at t + 1
    labels[trained] = batch.ids[trained]
    return labels


def train_adapters(loss_fn: Callable[[], Tensor], parameters: Iterable[nn.Parameter], steps: int,
                   lr: float, weight_decay: float = 0.0) -> list[float]:
    """``steps`` AdamW steps on ``loss_fn()`` (a scalar, recomputed each step); returns the losses.

    Each step zeroes the gradients, evaluates the loss, backpropagates and steps AdamW
    (Loshchilov and Hutter, 2019) with ``lr`` and ``weight_decay``; entry i of the result is
    the loss *before* update i + 1. The same function drives the book's model and ``peft``'s,
    so their trajectories differ only in the models.
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a function of no arguments, got {type(loss_fn).__name__}")
    params = list(parameters)
    if not params or not all(isinstance(p, Tensor) and p.requires_grad for p in params):
        raise ValueError("parameters must be a non-empty list of tensors with requires_grad=True")
    steps = check_positive_int("steps", steps)
    opt = torch.optim.AdamW(params, lr=check_positive_number("lr", lr),
                            weight_decay=check_nonnegative_number("weight_decay", weight_decay))
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        if not isinstance(loss, Tensor) or loss.ndim != 0:
            raise ValueError("loss_fn must return a scalar tensor")
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def add_adapters(model: nn.Module, recipe: Mapping[str, Any] | None = None) -> list[nn.Parameter]:
    """Put the recipe's LoRA adapters on ``model`` (:func:`~llmbook.alignment.lora.apply_lora`,
    A drawn from a generator seeded with ``recipe["seed"]``, B = 0); returns the trainable
    parameters. ``recipe`` defaults to :data:`LORA_RECIPE`."""
    recipe = dict(LORA_RECIPE if recipe is None else recipe)
    generator = torch.Generator().manual_seed(recipe["seed"])
    apply_lora(model, recipe["target_modules"], r=recipe["r"], alpha=recipe["alpha"],
               generator=generator)
    return [p for p in model.parameters() if p.requires_grad]


def lora_weights_as_peft(model: nn.Module, d_head: int, rope_interleaved: bool = True,
                         adapter: str = "default") -> dict[str, Tensor]:
    """The book's LoRA weights under ``peft``'s names, in the Hugging Face layout.

    ``blocks.{l}.attn.q_proj.lora_A`` becomes
    ``base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.{adapter}.weight`` (and so
    for every adapted layer: ``attn`` -> ``self_attn``, ``mlp`` stays). A model loaded from
    GGUF (:func:`~llmbook.inference.gguf.load_model`) keeps llama.cpp's interleaved rows of
    W_q and W_k, which Hugging Face stores half-split (chapter 5's
    :func:`~llmbook.transformer.positional.rope_permutation`, per head of ``d_head``
    rows); B (d_out, r) of a q or k adapter has the rows of W, so its rows are put back in
    Hugging Face's order. A (r, d_in) acts on the input, which is the same in both. Use it to
    copy the book's initial adapters into ``peft`` (``load_state_dict(..., strict=False)``)
    and to compare them after training. Returns clones.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    d_head = check_positive_int("d_head", d_head)
    perm = rope_permutation(d_head) if rope_interleaved else torch.arange(d_head)
    undo = torch.argsort(perm)  # interleaved -> half-split, within a head
    out = {}
    for name, layer in model.named_modules():
        if not isinstance(layer, LoRALinear):
            continue
        if layer.use_dora:
            raise ValueError(f"{name}: DoRA adapters are not converted")
        hf = "base_model.model.model." + name.replace("blocks.", "layers.", 1).replace(
            ".attn.", ".self_attn.")
        B = layer.lora_B.detach().clone()  # (d_out, r)
        if name.rsplit(".", 1)[-1] in ("q_proj", "k_proj"):
            if B.shape[0] % d_head:
                raise ValueError(f"{name}: d_out={B.shape[0]} is not a multiple of d_head={d_head}")
            B = B.view(-1, d_head, B.shape[1])[:, undo].reshape(B.shape)  # per head
        out[f"{hf}.lora_A.{adapter}.weight"] = layer.lora_A.detach().clone()
        out[f"{hf}.lora_B.{adapter}.weight"] = B
    if not out:
        raise ValueError("model has no LoRALinear layers; call apply_lora first")
    return out
