"""A tiny, randomly initialised model for fast tests: the engine's LoadedModel with no file.

Two Llama layers of width 64 over a byte-level tokenizer (every byte is a token, so any text
can be encoded) with SmolLM2's special tokens and a ChatML chat template. It builds in well
under a second and a step takes about a millisecond. Its numbers mean nothing; use it to
test what code does with a model's output, not what a model says.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from engine.kvcache import KVGeometry
from engine.loading import LoadedModel, ModelSource
from engine.tokens import TokenTexts

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONTEXT_WINDOW = 256


def byte_characters() -> list[str]:
    """The character GPT-2's byte-level tokenizers write for each byte 0-255 (printable bytes
    stand for themselves; the others are moved up past U+0100)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level: 256 byte tokens (ids 0-255), then the special tokens; `<|im_end|>` ends."""
    vocab = {char: i for i, char in enumerate(byte_characters())}
    vocab |= {token: len(vocab) + i for i, token in enumerate(SPECIAL_TOKENS)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>",
                                        eos_token="<|im_end|>", unk_token="<|endoftext|>",
                                        model_max_length=CONTEXT_WINDOW)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_lm(seed: int = 0) -> LoadedModel:
    """A LoadedModel around a random two-layer Llama (the same weights for the same seed)."""
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT_WINDOW,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)
    with torch.random.fork_rng():  # the weights' seed, without touching the caller's global one
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    return LoadedModel(
        model=model, tokenizer=tokenizer, source=ModelSource("folder", "tests/tiny.py"), name="tiny random Llama",
        device=torch.device("cpu"), dtype=torch.float32, eos_ids=(tokenizer.eos_token_id,),
        context_window=CONTEXT_WINDOW, geometry=KVGeometry.from_config(config),
        parameters=sum(p.numel() for p in model.parameters()), load_seconds=0.0, from_cache=False,
        texts=TokenTexts(tokenizer))
