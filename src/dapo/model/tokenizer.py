"""A small character-level tokenizer with a chat template, built locally (no hub)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, UNK, EOS = "<pad>", "<unk>", "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
SPECIAL_TOKENS = (PAD, UNK, EOS, *ROLE_TOKENS)

# ChatML-like: every message is <|role|>content<|end|>; generation starts after <|assistant|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Printable ASCII plus newline, one token per character, and the chat special tokens."""
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    # BPE without merges and without a pre-tokenizer splits text into single characters,
    # spaces and newlines included.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, unk_token=UNK, eos_token=EOS, padding_side="left"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
