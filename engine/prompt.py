"""What the model reads: the visitor's prompt as text and token ids, through the chat template
when asked, with special-token spellings the visitor typed kept as plain text by default.
Both generations (engine/generation.py, engine/speculative/generation.py) read their prompt
here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import PromptError
from engine.loading import LoadedModel

MAX_CHARS_PER_TOKEN = 64  # no tokenizer packs more characters into one token on ordinary text


def build_prompt(lm: LoadedModel, prompt: str, chat: bool, system_prompt: str | None = None, *,
                 allow_special: bool = False, max_prompt_tokens: int | None = None) -> PromptText:
    """The text the model reads and its token ids; with `chat`, through the chat template
    (whose own special tokens stay in the text, visible).

    Text the visitor typed that spells a special token (`<|im_end|>`, say) stays plain text, as
    chat servers treat it, with the chat template or without: tokenized as characters, it
    cannot end the text or, in chat mode, close the user's turn or forge a system turn (one
    rule, so a student never wonders why the same characters mean two things).
    `allow_special` lets it become the real special token (for a lesson on prompt injection).
    `max_prompt_tokens` caps the prompt below the context window.
    """
    _check_prompt_text("prompt", prompt, allow_empty=False)
    if system_prompt is not None:
        _check_prompt_text("system_prompt", system_prompt, allow_empty=True)
    limit = lm.context_window - 1 if max_prompt_tokens is None else min(max_prompt_tokens, lm.context_window - 1)
    # tokenizing costs time in proportion to the text: refuse what cannot fit before doing it
    if len(prompt) + len(system_prompt or "") > limit * MAX_CHARS_PER_TOKEN:
        raise PromptError(f"The prompt is {len(prompt):,} characters, far more than the {limit:,} tokens allowed: "
                          "shorten it.")
    if chat:
        text, ids, found = _chat_prompt(lm, prompt, system_prompt, allow_special)
    else:
        found = special_spellings(lm, prompt)
        ids = lm.tokenizer(prompt, split_special_tokens=bool(found) and not allow_special)["input_ids"]
        text = prompt
    if len(ids) > limit:
        raise PromptError(f"The prompt is {len(ids):,} tokens but at most {limit:,} are allowed here "
                          f"(the context window is {lm.context_window:,} tokens, with room needed for at least "
                          f"one new token): shorten the prompt.")
    return PromptText(text, list(ids), found)


@dataclass(frozen=True)
class PromptText:
    """What the model reads, as text and as token ids."""

    text: str
    ids: list[int]
    special_text: tuple[str, ...]  # special-token spellings the visitor typed (kept as plain text unless allowed)


def _check_prompt_text(parameter: str, text: object, allow_empty: bool) -> None:
    if not isinstance(text, str):
        raise PromptError(f"The {parameter} must be text, not {type(text).__name__}.")
    if not allow_empty and not text.strip():
        raise PromptError("The prompt is empty: type some text for the model to continue.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer can read it
        raise PromptError(f"The {parameter} has a character that is not valid Unicode text at position "
                          f"{exc.start}: remove it.") from exc


def special_spellings(lm: LoadedModel, text: str) -> tuple[str, ...]:
    """The special tokens whose spelling occurs in `text`, in vocabulary order."""
    return tuple(token for token in _special_tokens(lm) if token in text)


def _special_tokens(lm: LoadedModel) -> list[str]:
    """Every special token's spelling, longest first (so a longer one wins where two overlap)."""
    tokens = {t.content for t in lm.tokenizer.added_tokens_decoder.values() if t.special and t.content}
    return sorted(tokens, key=lambda t: (-len(t), t))


def _chat_prompt(lm: LoadedModel, prompt: str, system_prompt: str | None, allow_special: bool
                 ) -> tuple[str, list[int], tuple[str, ...]]:
    """The chat template around the visitor's messages. Unless `allow_special`, only the
    template's own special tokens are read as special tokens; the visitor's text is read as
    characters. The text between the template's special tokens is tokenized as one piece,
    exactly as the tokenizer reads the whole text, so ordinary prompts give the same ids."""
    if not lm.has_chat_template:
        raise PromptError(f"{lm.name} has no chat template: turn the chat template off.")
    tokenizer = lm.tokenizer
    found = special_spellings(lm, prompt + (system_prompt or ""))
    contents = ([system_prompt] if system_prompt else []) + [prompt]
    roles = (["system"] if system_prompt else []) + ["user"]
    # each message is rendered as a marker, so the template's own special tokens can be found
    # in it; the markers are only ever searched for in the template
    markers = [f"\ue000{i}\ue001" for i in range(len(contents))]
    template = tokenizer.apply_chat_template([{"role": r, "content": m} for r, m in zip(roles, markers, strict=True)],
                                             add_generation_prompt=True, tokenize=False)
    pieces = re.split("(" + "|".join(map(re.escape, _special_tokens(lm))) + ")", template)
    for marker, content in zip(markers, contents, strict=True):
        pieces = [piece.replace(marker, content) for piece in pieces]
    text = "".join(pieces)
    if allow_special:
        return text, tokenizer(text, add_special_tokens=False)["input_ids"], found
    ids: list[int] = []
    for index, piece in enumerate(pieces):  # odd places hold the template's special tokens
        if index % 2:
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        elif piece:
            ids += tokenizer(piece, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return text, ids, found
