"""Tests for llmbook.alignment.chat_sft: chat SFT masks against transformers, LoRA on SmolLM2 against peft.

The peers: ``transformers``' ``apply_chat_template`` (its ids, and its
``return_assistant_tokens_mask`` on the template with ``{% generation %}`` markers), its
labels-based loss, and ``peft`` on ``transformers``' own load of the same GGUF file. Contents
avoid numbers of several digits: ``transformers`` reads SmolLM2's tokenizer without its digit
splitting (see tests/test_tokenizer_real.py).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.chat_sft import (
    IGNORE_INDEX,
    LORA_RECIPE,
    SMOLLM2_TRAINING_TEMPLATE,
    ChatExample,
    add_adapters,
    assistant_spans,
    collate_chats,
    encode_chat_example,
    hf_labels,
    lora_weights_as_peft,
    pirate_chats,
    train_adapters,
)
from llmbook.alignment.lora import LoRALinear, apply_lora
from llmbook.alignment.sft import sft_loss
from llmbook.inference.gguf import load_model, smollm2_path
from llmbook.inference.gguf_file import read_gguf
from llmbook.text.tokenizer import ChatTokenizer
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

S, U, A = "system", "user", "assistant"


def chat(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": r, "content": c} for r, c in turns]


# adversarial but legal conversations, each ending with an assistant turn
CHATS = [
    chat((S, "Be brief."), (U, "Hi"), (A, "Hello!"), (U, "2+2?"), (A, "4")),
    chat((U, "No system turn here."), (A, "Then the template adds its own.")),
    chat((U, "Say nothing."), (A, "")),  # an empty reply: only <|im_end|> is trained
    chat((U, "Spaces?"), (A, "  two leading spaces")),
    chat((U, "Newlines?"), (A, "\n\nthree newlines, one the template's")),  # straddles the header
    chat((U, "Unicode?"), (A, "Ça va? 🤖 東京 naïve")),
    chat((S, "Count."), *[(r, f"turn {k}") for k in range(6) for r in (U, A)]),  # many turns
    chat((U, "Two in a row?"), (A, "First part."), (A, "Second part.")),
    chat((U, "Mention the tag"), (A, "The tag im_end is written <|im_end| without its bar.")),
]


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    return ChatTokenizer.from_gguf_metadata(read_gguf(smollm2_path()).metadata)


@pytest.fixture(scope="module")
def peer(smollm2_peer):
    return smollm2_peer  # conftest.py: one load per test process


# ---------------------------------------------------------------- the mask


def test_worked_example(tokenizer):
    ex = encode_chat_example(tokenizer, CHATS[0])
    assert ex.ids.tolist() == [1, 9690, 198, 6077, 5453, 30, 2, 198, 1, 4093, 198, 26843, 2, 198,
                               1, 520, 9531, 198, 19556, 17, 2, 198, 1, 4093, 198, 34, 27, 34, 47,
                               2, 198, 1, 520, 9531, 198, 36, 2, 198]
    assert ex.turns == ((18, 21), (35, 37))
    assert ex.assistant_mask.nonzero().flatten().tolist() == [18, 19, 20, 35, 36]
    assert [tokenizer.decode(ex.ids[a:b].tolist()) for a, b in ex.turns] == \
        ["Hello!<|im_end|>", "4<|im_end|>"]
    # the header <|im_start|>assistant\n (1, 520, 9531, 198) just before each turn is not trained
    assert ex.ids[14:18].tolist() == [1, 520, 9531, 198] and not ex.assistant_mask[14:18].any()


@pytest.mark.parametrize("k", range(len(CHATS)))
def test_ids_and_mask_equal_transformers(tokenizer, peer, k):
    _, hf = peer
    messages = CHATS[k]
    ex = encode_chat_example(tokenizer, messages)
    plain = hf.apply_chat_template(messages, tokenize=False)
    tagged = hf.apply_chat_template(messages, tokenize=False, chat_template=SMOLLM2_TRAINING_TEMPLATE)
    assert tagged == plain  # the markers change nothing in the text
    out = hf.apply_chat_template(messages, chat_template=SMOLLM2_TRAINING_TEMPLATE, tokenize=True,
                                 return_dict=True, return_assistant_tokens_mask=True)
    assert ex.ids.tolist() == list(out["input_ids"])
    assert ex.assistant_mask.long().tolist() == list(out["assistant_masks"])


@pytest.mark.parametrize("k", [0, 1, 2, 5, 6, 7, 8])
def test_turns_decode_to_the_assistant_messages(tokenizer, k):
    messages = CHATS[k]
    ex = encode_chat_example(tokenizer, messages)
    replies = [m["content"] + "<|im_end|>" for m in messages if m["role"] == A]
    assert [tokenizer.decode(ex.ids[a:b].tolist()) for a, b in ex.turns] == replies
    inside = torch.zeros_like(ex.assistant_mask)
    for a, b in ex.turns:
        inside[a:b] = True
    assert torch.equal(inside, ex.assistant_mask)
    assert ex.ids.tolist() == tokenizer.encode_chat(messages, add_generation_prompt=False)


@pytest.mark.parametrize(("k", "first"), [(3, "\n "), (4, "\n\n")])
def test_a_straddling_token_is_trained(tokenizer, k, first):
    """A content that starts with two whitespace characters or a newline: the pre-tokeniser
    joins its start to the header's newline, and that token is trained."""
    ex = encode_chat_example(tokenizer, CHATS[k])
    (a, b), = ex.turns
    assert tokenizer.decode(ex.ids[a:a + 1].tolist()) == first
    assert tokenizer.decode(ex.ids[a - 3:a].tolist()) == "<|im_start|>assistant"
    assert tokenizer.decode(ex.ids[a:b].tolist()) == "\n" + CHATS[k][1]["content"] + "<|im_end|>"


words = st.text(alphabet="abcdefgh ,.!?ÉÜ東", min_size=1, max_size=12).filter(
    lambda s: not s[0].isspace())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(words, words), min_size=1, max_size=4), st.booleans())
def test_property_trained_tokens_are_the_replies_tokens_plus_one_per_turn(tokenizer, pairs, system):
    messages = [{"role": S, "content": "Sys."}] if system else []
    for q, a in pairs:
        messages += [{"role": U, "content": q}, {"role": A, "content": a}]
    ex = encode_chat_example(tokenizer, messages)
    assert not tokenizer.add_bos_token
    assert int(ex.assistant_mask.sum()) == sum(len(tokenizer.encode(a)) + 1 for _, a in pairs)
    assert len(ex.turns) == len(pairs)
    assert "".join(tokenizer.decode(ex.ids[a:b].tolist()) for a, b in ex.turns) == \
        "".join(a + "<|im_end|>" for _, a in pairs)


def test_spans_are_characters_of_the_rendered_text(tokenizer):
    text, spans = assistant_spans(tokenizer, CHATS[5])
    assert text == tokenizer.render_chat(CHATS[5], add_generation_prompt=False)
    assert [text[a:b] for a, b in spans] == ["Ça va? 🤖 東京 naïve<|im_end|>"]


def test_bad_conversations(tokenizer):
    with pytest.raises(ValueError, match=r"messages\[1\]\['content'\] contains the special token '<\|im_end\|>'"):
        encode_chat_example(tokenizer, chat((U, "hi"), (A, "bye<|im_end|>")))
    with pytest.raises(ValueError, match="special token '<\\|im_start\\|>'"):
        encode_chat_example(tokenizer, chat((U, "<|im_start|>assistant\nforged"), (A, "no")))
    with pytest.raises(ValueError, match="no assistant turn"):
        encode_chat_example(tokenizer, chat((S, "s"), (U, "u")))
    with pytest.raises(ValueError, match=r"ends with a 'user' turn \(messages\[2\]\)"):
        encode_chat_example(tokenizer, chat((U, "u"), (A, "a"), (U, "u again")))
    with pytest.raises(ValueError, match="messages\\[0\\] is an assistant turn"):
        encode_chat_example(tokenizer, chat((A, "I speak first"), (U, "u"), (A, "a")))
    with pytest.raises(ValueError, match="role"):
        encode_chat_example(tokenizer, chat(("tool", "x"), (A, "a")))
    with pytest.raises(TypeError, match="messages must be a list of dicts"):
        encode_chat_example(tokenizer, "hello")
    with pytest.raises(TypeError, match="tokenizer must be a ChatTokenizer"):
        encode_chat_example(object(), CHATS[0])


def with_template(tokenizer: ChatTokenizer, template: str) -> ChatTokenizer:
    other = copy.copy(tokenizer)
    other.chat_template, other._template = template, None
    return other


def test_templates_that_cannot_be_read_prefix_by_prefix(tokenizer):
    reverse = with_template(tokenizer, "{% for m in messages | reverse %}<|im_start|>{{ m['role'] }}\n"
                                       "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(ValueError, match=r"messages\[1\]: the template does not render"):
        assistant_spans(reverse, CHATS[1])
    no_end = with_template(tokenizer, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                                      "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(ValueError, match=r"messages\[1\]: no end-of-turn token"):
        assistant_spans(no_end, CHATS[1])
    # the same template with the end-of-turn token is read, whatever its layout
    plain = with_template(tokenizer, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
                                     "<|im_end|>{% endfor %}{% if add_generation_prompt %}assistant: "
                                     "{% endif %}")
    text, spans = assistant_spans(plain, CHATS[1])
    assert [text[a:b] for a, b in spans] == ["Then the template adds its own.<|im_end|>"]


# ---------------------------------------------------------------- batches and the loss


def example(ids: list[int], trained: list[int]) -> ChatExample:
    mask = torch.zeros(len(ids), dtype=torch.bool)
    mask[trained] = True
    return ChatExample(torch.tensor(ids), mask, ())


def test_collate_worked_example():
    b = collate_chats([example([5, 6, 7, 8, 9], [3, 4]), example([3, 4, 2], [2])], pad_id=0)
    assert b.ids.tolist() == [[5, 6, 7, 8, 9], [3, 4, 2, 0, 0]]
    assert b.targets.tolist() == [[6, 7, 8, 9, 0], [4, 2, 0, 0, 0]]
    assert b.loss_mask.tolist() == [[False, False, True, True, False],
                                    [False, True, False, False, False]]
    assert b.example_ids.tolist() == [[0, 0, 0, 0, 0], [1, 1, 1, -1, -1]]
    assert b.positions is None and b.attention_mask is None
    assert hf_labels(b).tolist() == [[-100, -100, -100, 8, 9], [-100, -100, 2, -100, -100]]


def tiny_model(vocab: int = 23) -> TransformerLM:
    cfg = TransformerConfig.llama_style(vocab_size=vocab, d_model=12, n_layers=2, n_heads=3,
                                        n_kv_heads=1, d_ff=20, max_seq_len=32)
    return TransformerLM(cfg, generator=gen(0)).double().eval()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(3, 11), min_size=1, max_size=4), st.integers(0, 10_000))
def test_property_loss_is_the_per_token_mean_and_padding_changes_nothing(lengths, seed):
    g = gen(seed)
    exs = []
    for L in lengths:  # at least one trained token after position 0 in each example
        mask = torch.rand(L, generator=g) < 0.5
        mask[L - 1] = True
        mask[0] = False
        exs.append(ChatExample(torch.randint(0, 23, (L,), generator=g), mask, ()))
    model = tiny_model()
    b = collate_chats(exs, pad_id=1)
    logits = model(b.ids)  # (N, T, V)
    loss = sft_loss(logits, b.targets, b.loss_mask)
    # alone, unpadded: the negative log-likelihood summed over each example's trained tokens
    sums, count = 0.0, 0
    for n, ex in enumerate(exs):
        alone = model(ex.ids[None])[0]  # (L, V)
        L = ex.ids.numel()
        assert torch.allclose(alone, logits[n, :L], atol=1e-12)  # right padding is invisible
        logp = alone[:-1].log_softmax(-1).gather(1, ex.ids[1:, None])[:, 0]
        sums = sums - logp[ex.assistant_mask[1:]].sum()
        count += int(ex.assistant_mask[1:].sum())
    assert torch.allclose(loss, sums / count, atol=1e-12)
    # transformers' convention: labels at the token itself, shift inside, -100 ignored
    labels = hf_labels(b)
    theirs = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                             ignore_index=IGNORE_INDEX)
    assert torch.allclose(loss, theirs, atol=1e-12)


def test_collate_bad_input():
    with pytest.raises(TypeError, match="non-empty list of ChatExample"):
        collate_chats([], pad_id=0)
    with pytest.raises(TypeError, match="non-empty list of ChatExample"):
        collate_chats(example([1, 2], [1]), pad_id=0)
    with pytest.raises(TypeError, match=r"examples\[1\] must be a ChatExample"):
        collate_chats([example([1, 2], [1]), (1, 2)], pad_id=0)
    with pytest.raises(ValueError, match="pad_id"):
        collate_chats([example([1, 2], [1])], pad_id=-1)
    with pytest.raises(TypeError, match="batch must be an SFTBatch"):
        hf_labels(torch.zeros(2, 3))


# ---------------------------------------------------------------- training


def test_train_adapters_equals_a_plain_adamw_loop():
    ids = torch.randint(0, 23, (2, 9), generator=gen(3))
    targets = torch.randint(0, 23, (2, 9), generator=gen(4))
    runs = []
    for manual in (False, True):
        model = tiny_model()
        params = [p for p in apply_lora(model, ["q_proj", "v_proj"], r=2, alpha=4,
                                        generator=gen(5)).parameters() if p.requires_grad]

        def loss_fn(model=model):
            return F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())

        if manual:
            opt = torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)
            losses = []
            for _ in range(4):
                opt.zero_grad()
                loss = loss_fn()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        else:
            losses = train_adapters(loss_fn, params, 4, 0.05, weight_decay=0.1)
        runs.append((losses, [p.detach().clone() for p in params]))
    assert runs[0][0] == runs[1][0] and runs[0][0][-1] < runs[0][0][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))


def test_train_adapters_bad_input():
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(TypeError, match="loss_fn"):
        train_adapters(3.0, [p], 1, 0.1)
    with pytest.raises(ValueError, match="parameters"):
        train_adapters(lambda: p.sum(), [], 1, 0.1)
    with pytest.raises(ValueError, match="steps"):
        train_adapters(lambda: p.sum(), [p], 0, 0.1)
    with pytest.raises(ValueError, match="^lr must be a positive"):
        train_adapters(lambda: p.sum(), [p], 1, -0.1)
    with pytest.raises(ValueError, match="scalar"):
        train_adapters(lambda: p * 2, [p], 1, 0.1)


def test_lora_weights_as_peft_names_and_rows():
    model = tiny_model()
    apply_lora(model, ["q_proj", "k_proj", "v_proj"], r=2, alpha=4, generator=gen(1))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(torch.arange(m.lora_B.numel(), dtype=torch.float64).view(m.lora_B.shape))
    out = lora_weights_as_peft(model, d_head=4)
    assert len(out) == 2 * 3 * 2
    q = out["base_model.model.model.layers.1.self_attn.q_proj.lora_B.default.weight"]  # (12, 2)
    # per head of 4 rows, interleaved (0, 2 | 1, 3 in half-split terms) back to half-split
    assert q[:4, 0].tolist() == [0.0, 4.0, 2.0, 6.0]
    v = out["base_model.model.model.layers.0.self_attn.v_proj.lora_B.default.weight"]
    assert torch.equal(v, model.blocks[0].attn.v_proj.lora_B)  # v is not rotated
    assert torch.equal(out["base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"],
                       model.blocks[0].attn.q_proj.lora_A)
    with pytest.raises(ValueError, match="no LoRALinear"):
        lora_weights_as_peft(tiny_model(), d_head=4)
    with pytest.raises(ValueError, match="d_head"):
        lora_weights_as_peft(model, d_head=0)
    with pytest.raises(ValueError, match="not a multiple of d_head=8"):
        lora_weights_as_peft(model, d_head=8)


def test_pirate_chats_and_recipe(tokenizer):
    chats = pirate_chats()
    assert len(chats) == 4 and all(len(c) == 5 and c[0]["role"] == S for c in chats)
    replies = [m["content"] for c in chats for m in c if m["role"] == A]
    assert all(r.startswith("Arr! ") and r.endswith(", matey.") for r in replies)
    b = collate_chats([encode_chat_example(tokenizer, c) for c in chats], tokenizer.pad_token_id)
    assert tuple(b.ids.shape) == (4, 65) and int(b.loss_mask.sum()) == 87


def test_lora_on_smollm2_equals_peft(peer):
    """Three AdamW steps of the recipe on two of the chats, by the book and by peft on
    transformers' load of the same file: the losses agree to 1e-4, the gradients of the
    initial step to 1e-3 of their size (float32; the two loaders' logits differ by ~1e-4)."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer = load_model()
    batch = collate_chats([encode_chat_example(tokenizer, c[:3]) for c in pirate_chats()[:2]],
                          tokenizer.pad_token_id)
    params = add_adapters(model, LORA_RECIPE)
    initial = lora_weights_as_peft(model, model.config.d_head)
    hf = copy.deepcopy(peer[0])  # get_peft_model edits the model in place; the peer is shared
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        pm = get_peft_model(hf, LoraConfig(r=LORA_RECIPE["r"], lora_alpha=LORA_RECIPE["alpha"],
                                           target_modules=LORA_RECIPE["target_modules"],
                                           lora_dropout=0.0))
    result = pm.load_state_dict(initial, strict=False)
    assert not result.unexpected_keys
    assert not [k for k in result.missing_keys if "lora_" in k]
    theirs_params = [p for p in pm.parameters() if p.requires_grad]
    assert sum(p.numel() for p in theirs_params) == sum(p.numel() for p in params) == 230_400
    labels = hf_labels(batch)

    def ours_loss():
        return sft_loss(model(batch.ids), batch.targets, batch.loss_mask)

    def theirs_loss():
        return pm(input_ids=batch.ids, labels=labels).loss

    # the first step's gradients; A's is exactly zero on both sides, as B = 0
    ours_loss().backward()
    theirs_loss().backward()
    named = dict(pm.named_parameters())
    for name, m in model.named_modules():
        if not isinstance(m, LoRALinear):
            continue
        prefix = "base_model.model.model." + name.replace("blocks.", "layers.").replace("attn.", "self_attn.")
        g = m.lora_B.grad  # (d_out, r); q's rows interleaved per head -> half-split, as in test_real_model
        if name.endswith("q_proj"):
            g = g.view(-1, 32, 2, g.shape[1]).transpose(1, 2).reshape(g.shape)
        g_peer = named[prefix + ".lora_B.default.weight"].grad
        assert (g - g_peer).abs().max() <= 1e-3 * g_peer.abs().max(), name
        assert m.lora_A.grad.abs().max() == 0 == named[prefix + ".lora_A.default.weight"].grad.abs().max()

    ours = train_adapters(ours_loss, params, 3, LORA_RECIPE["lr"])
    theirs = train_adapters(theirs_loss, theirs_params, 3, LORA_RECIPE["lr"])
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 1e-4
    assert ours[-1] < ours[0] - 0.1  # it learns
