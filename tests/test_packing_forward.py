"""use_remove_padding: packed log-probs, entropies and gradients equal the padded computation."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.actor.forward import pack_rows, packed_response_logprobs, response_logprobs
from fixtures.actor_helpers import rl_batch


@pytest.fixture(scope="module")
def model(tiny_random_model_dir):
    from dapo.model.loader import load_model

    return load_model(tiny_random_model_dir)


def test_pack_rows_positions_restart_per_sequence():
    ids = torch.tensor([[0, 0, 5, 6, 7, 0], [0, 8, 9, 10, 11, 12]])
    attn = (ids != 0).long()
    p = pack_rows(ids, attn)
    assert p["ids"].tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    assert p["positions"].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert p["cu_seqlens"] == [0, 3, 8]
    assert p["where"].tolist() == [[-1, -1, 0, 1, 2, -1], [-1, 3, 4, 5, 6, 7]]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 6), temperature=st.sampled_from([0.6, 1.0]))
def test_packed_equals_padded(model, char_tokenizer, seed, rows, temperature):
    b = rl_batch(len(char_tokenizer), rows=rows, P=6, R=9, seed=seed)
    ids, attn, mask = b.tensors["input_ids"], b.tensors["attention_mask"], b.tensors["response_mask"]
    model.eval()
    with torch.no_grad():
        lp_pad, ent_pad = response_logprobs(model, ids, attn, 9, temperature, True)
        lp_pack, ent_pack = packed_response_logprobs(model, ids, attn, 9, temperature, True)
    torch.testing.assert_close(lp_pack, lp_pad * mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_pack, ent_pad * mask, atol=1e-5, rtol=1e-5)
    assert (lp_pack[mask == 0] == 0).all()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_gradients_equal_padded(tiny_random_model_dir, char_tokenizer, checkpointing):
    from dapo.model.loader import load_model

    model = load_model(tiny_random_model_dir)
    model.train()
    b = rl_batch(len(char_tokenizer), rows=6, seed=9)
    ids, attn, mask = b.tensors["input_ids"], b.tensors["attention_mask"], b.tensors["response_mask"].float()

    def grads(fn):
        model.zero_grad(set_to_none=True)
        lp, ent = fn(model, ids, attn, 7, 0.8, True)
        ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        return [p.grad.clone() for p in model.parameters()]

    padded = grads(response_logprobs)
    if checkpointing:
        model.gradient_checkpointing_enable()
    packed = grads(packed_response_logprobs)
    for a, c in zip(padded, packed):
        torch.testing.assert_close(c, a, atol=1e-5, rtol=1e-5)
