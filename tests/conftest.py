import os
import shutil
import tempfile

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)

# Tests never read or write the user's cache (~/.cache/dapo): the built-in data and warm-started
# models go to a cache made for this session, so each is built at most once per session, and
# child processes inherit it through the environment. DAPO_TEST_CACHE names a directory to keep
# them in across sessions instead (a warm start then builds only when its recipe changes).
_SESSION_CACHE = None
if os.environ.get("DAPO_TEST_CACHE"):
    os.environ["DAPO_CACHE"] = os.environ["DAPO_TEST_CACHE"]
else:
    _SESSION_CACHE = tempfile.mkdtemp(prefix="dapo-test-cache-")
    os.environ["DAPO_CACHE"] = _SESSION_CACHE


def pytest_unconfigure(config):
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def char_tokenizer():
    from dapo.model.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


def save_tiny_random_model(out, tok, seed: int = 0, **config):
    """A randomly initialised tiny Qwen2 (64 hidden, 2 layers; ``config`` overrides) and ``tok``
    saved in ``out`` as a Hugging Face directory."""
    from transformers import Qwen2ForCausalLM

    from dapo.model.tiny import tiny_config

    torch.manual_seed(seed)
    shape = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, **config}
    Qwen2ForCausalLM(tiny_config(len(tok), tok.pad_token_id, tok.eos_token_id, **shape)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_random_model_dir(tmp_path_factory, char_tokenizer):
    """A randomly initialised tiny Qwen2 + char tokenizer saved as a Hugging Face directory."""
    return save_tiny_random_model(tmp_path_factory.mktemp("tiny_random"), char_tokenizer)


# head size 32 (the smallest vLLM's CPU attention takes) and 512 positions
HD32 = {"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512}


@pytest.fixture(scope="session")
def tiny_hd32_model_dir(tmp_path_factory, char_tokenizer):
    """The same with head size 32 (:data:`HD32`)."""
    return save_tiny_random_model(tmp_path_factory.mktemp("tiny_hd32"), char_tokenizer, **HD32)


# the char tokenizer's EOS and 20 more of its 103 tokens
MANY_EOS = [2, *range(40, 60)]


@pytest.fixture(scope="session")
def eos_hd32_model_dir(tmp_path_factory, tiny_hd32_model_dir):
    """The head-size-32 model stopping on a fifth of its vocabulary (:data:`MANY_EOS`, its
    generation config's EOS list): a random model's responses then end at different lengths."""
    import json
    import shutil

    d = tmp_path_factory.mktemp("hd32_many_eos") / "model"
    shutil.copytree(tiny_hd32_model_dir, d)
    gen = d / "generation_config.json"
    cfg = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**cfg, "eos_token_id": MANY_EOS}))
    return d


@pytest.fixture(scope="module")
def mod3_task(tmp_path_factory):
    """(train.parquet, test.parquet, reward.py): 64/8 built-in problems and the mod-3 reward
    (tests/runs.py); the resume tests run on it."""
    from runs import write_mod3_task

    return write_mod3_task(tmp_path_factory.mktemp("resume_task"))
