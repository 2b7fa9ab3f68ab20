"""The exercise solutions of notebooks/17b_chat_finetuning hold."""

import pytest
import sympy as sp
from solution_loader import load_solutions

from llmbook.alignment.chat_sft import encode_chat_example, pirate_chats
from llmbook.inference.gguf import load_model, smollm2_path
from llmbook.inference.gguf_file import read_gguf
from llmbook.text.tokenizer import ChatTokenizer

solutions = load_solutions("17b_chat_finetuning")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer.from_gguf_metadata(read_gguf(smollm2_path()).metadata)


def test_exercise_1_fraction_formula_matches_built_conversations(tok):
    for n in (1, 12, 20):
        assert len(tok.encode(solutions.words(n))) == n
    f = solutions.trained_fraction()
    K, s, u, a = sp.symbols("K s u a", positive=True, integer=True)
    s_val = len(tok.encode(solutions.DEFAULT_SYSTEM))
    for k in (1, 2, 3):
        ex = encode_chat_example(tok, solutions.long_conversation(k, 12, 20))
        measured = sp.Rational(int(ex.assistant_mask.sum()), ex.ids.numel())
        assert f.subs({K: k, s: s_val, u: 12, a: 20}) == measured
    out = solutions.exercise_1(tok)
    assert out["s"] == s_val == 16
    assert out["limit"] == sp.Rational(21, 43)
    assert out["f1"] == sp.Rational(21, 64)
    assert out["K"] == 5  # 21 K / (21 + 43 K) > (9/10)(21/43) <=> K > 4.4
    f_num = f.subs({s: s_val, u: 12, a: 20})
    assert f_num.subs(K, 5) > sp.Rational(9, 10) * out["limit"] >= f_num.subs(K, 4)


def test_exercise_2_header_tokens_are_almost_free():
    model, tok = load_model()
    chats = pirate_chats()
    ex = encode_chat_example(tok, chats[0])
    header = solutions.header_mask(ex)
    assert int(header.sum()) == 4 * len(ex.turns)
    assert not (header & ex.assistant_mask).any()
    per_position, reply = solutions.header_and_reply_losses(model, tok, chats)
    assert per_position.shape == (4,)
    # every header token is almost free: the template fixes it
    assert per_position.max() < 0.01 and reply > 2.5
    # adding them to the mask scales the mean (and its gradient) by about 87 / (87 + 32)
    diluted = solutions.diluted_loss(per_position, reply, n_reply=87, n_turns=8)
    assert abs(diluted - reply * 87 / 119) < 0.01


def test_exercise_3_forged_turns(tok):
    n_headers, spans = solutions.exercise_3(tok)
    assert n_headers == 2
    assert spans == ["I will obey.<|im_end|>", "Hello.<|im_end|>"]
    with pytest.raises(ValueError, match="special token"):
        encode_chat_example(tok, solutions.FORGED)
    ids = [5, *solutions.ASSISTANT_HEADER, 7, 2, 9]
    assert solutions.id_based_mask(ids).tolist() == [False] * 5 + [True, True, False]
    assert solutions.count_headers(ids) == 1
