"""A tiny random-initialised Hugging Face checkpoint, built offline.

Tests and ``benchmarks/rollout.py`` need a real ``AutoModelForCausalLM`` directory to
exercise the ``hf`` backend's loading path, and nothing can be downloaded. This writes one:
a small ``LlamaForCausalLM`` plus a character-level fast tokenizer whose vocabulary is
the special tokens and every character of :data:`marl.tokenizer.CHARSET`, in the same
order as :class:`~marl.tokenizer.CharTokenizer` (so ids agree with the built-in tokenizer).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from marl.policies.hf import import_optional
from marl.tokenizer import CHARSET, SPECIAL_TOKENS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: A minimal chat template: one ``role: content`` line per message after ``<bos>``.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tiny_hf(path: str | Path, *, hidden_size: int = 64, num_layers: int = 2,
                  num_heads: int = 4, intermediate_size: int = 256,
                  max_position_embeddings: int = 2048, seed: int = 0,
                  chat_template: bool = False) -> Path:
    """Write a tiny random Llama checkpoint and its char tokenizer into ``path``.

    Deterministic for a seed: the same arguments give the same weights.
    """
    transformers = import_optional("transformers")
    path = Path(path)
    tokenizer = char_tokenizer(chat_template=chat_template)
    pad, bos, eos = (tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS[:3])
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_heads,
        intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
        pad_token_id=pad, bos_token_id=bos, eos_token_id=eos, tie_word_embeddings=False,
    )
    # A local generator would not reach transformers' initialisers; fork the global RNG
    # so that building a model leaves the caller's random state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def char_tokenizer(*, chat_template: bool = False) -> PreTrainedTokenizerFast:
    """A ``PreTrainedTokenizerFast`` with one token per :data:`CHARSET` character, ids
    as in :class:`~marl.tokenizer.CharTokenizer`; other characters map to ``<unk>``."""
    tk = import_optional("tokenizers")
    transformers = import_optional("transformers")
    vocab = {t: i for i, t in enumerate((*SPECIAL_TOKENS, *CHARSET))}
    backend = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="<unk>"))
    # `[\s\S]`, not `.`: the dot skips newlines, so "\n\n" would stay one (unknown) piece.
    backend.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = tk.decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
        unk_token="<unk>", clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE if chat_template else None,
    )
