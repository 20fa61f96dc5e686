import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def char_tokenizer():
    from dapo.model.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_random_model_dir(tmp_path_factory, char_tokenizer):
    """A randomly initialised tiny Qwen2 + char tokenizer saved as a Hugging Face directory."""
    from runs import write_tiny_random_model

    return write_tiny_random_model(tmp_path_factory.mktemp("tiny_random"), char_tokenizer)


@pytest.fixture(scope="module")
def mod3_task(tmp_path_factory):
    """(train.parquet, test.parquet, reward.py): 64/8 built-in problems and the mod-3 reward
    (tests/runs.py); the resume tests run on it."""
    from runs import write_mod3_task

    return write_mod3_task(tmp_path_factory.mktemp("resume_task"))
