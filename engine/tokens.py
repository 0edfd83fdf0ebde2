"""How a single token looks on screen: its text, with special tokens and partial UTF-8
bytes made visible instead of silently vanishing or turning into '\ufffd'."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from transformers import PreTrainedTokenizerBase

# Whitespace drawn as visible glyphs so a student can see that " Paris" starts with a space
# (the pages' chips and labels, and the slides)
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def visible(text: str) -> str:
    """Token text with spaces, newlines, tabs and returns drawn as ␣ ↵ ⇥ ␍ (plain text, not HTML)."""
    return "".join(VISIBLE.get(ch, ch) for ch in text) if text else "∅"


@dataclass(frozen=True)
class TokenPiece:
    """One token as text.

    `text` is what the token contributes to the decoded output; bytes that do not form a
    whole UTF-8 character on their own are written `<0xE2>`; special tokens keep their name.
    """

    token_id: int
    text: str
    special: bool
    partial_bytes: bool


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as one printable character; map back.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to code
    points 256 and up, in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in alphabet.values():
            alphabet[chr(256 + shifted)] = b
            shifted += 1
    return alphabet


def _token_bytes(tokenizer: PreTrainedTokenizerBase, token_id: int) -> bytes | None:
    """The raw bytes of a byte-level or byte-fallback token, or None if unknown."""
    token = tokenizer.convert_ids_to_tokens(token_id)
    if token is None:
        return None
    if token.startswith("<0x") and token.endswith(">") and len(token) == 6:  # SentencePiece byte
        return bytes([int(token[3:5], 16)])
    alphabet = _byte_level_alphabet()
    if all(ch in alphabet for ch in token):
        return bytes(alphabet[ch] for ch in token)
    return None


def _visible_bytes(raw: bytes) -> str:
    """Decode what is valid UTF-8 and write every stray byte as <0xNN>."""
    out: list[str] = []
    i = 0
    while i < len(raw):
        for width in (4, 3, 2, 1):
            chunk = raw[i:i + width]
            try:
                out.append(chunk.decode("utf-8"))
                i += len(chunk)
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<0x{raw[i]:02X}>")
            i += 1
    return "".join(out)


class TokenTexts:
    """Visible text for token ids, computed once per id (pieces never change)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._special_ids = frozenset(tokenizer.all_special_ids)
        self._pieces: dict[int, TokenPiece] = {}

    def piece(self, token_id: int) -> TokenPiece:
        """The visible text of one token."""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._make_piece(token_id)
        return piece

    def _make_piece(self, token_id: int) -> TokenPiece:
        tokenizer = self._tokenizer
        if token_id in self._special_ids:
            name = tokenizer.convert_ids_to_tokens(token_id)
            return TokenPiece(token_id, name, special=True, partial_bytes=False)
        text = tokenizer.decode([token_id], skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)
        if "\ufffd" not in text:
            return TokenPiece(token_id, text, special=False, partial_bytes=False)
        raw = _token_bytes(tokenizer, token_id)
        visible = text if raw is None else _visible_bytes(raw)
        return TokenPiece(token_id, visible, special=False, partial_bytes=True)
