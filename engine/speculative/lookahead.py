"""Lookahead decoding without a draft model: Jacobi iteration and an n-gram pool.

Jacobi decoding treats the next few tokens as unknowns solved together: guess them, run one
pass over the guesses, and take the model's prediction at every guessed position as the next,
better guess. Greedy decoding is its fixed point: once every guess equals the model's own
argmax at its position, the guesses are exactly what plain decoding would write, and the verify
pass accepts them all. Here the refinement happens inside the verify pass the round already
runs: after a round, the target's predictions at the positions past the first rejected guess
(made in the same pass, conditioned on that wrong guess) are the next round's guesses.

Every pass also leaves n-grams: the runs of tokens the model predicted one after another. They
go into a pool keyed by the token before them (lookahead decoding's n-gram cache). The text
itself is a second pool, keyed by two tokens, as prompt lookup reads it. A round guesses from
the text pool first (what was really written after the context's last two tokens), then from
the pass's n-grams after its last token, then from the Jacobi window.

The guesses are deterministic (q is a one-hot), so the standard rule keeps the output exact
under greedy decoding and under sampling alike: a guessed token is kept with probability p(x).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.errors import SettingsError
from engine.settings import SamplerSettings
from engine.speculative.drafting import NO_DRAFT, Draft, DraftPicture, RoundOutcome

NGRAM = 4  # tokens an n-gram proposes after its key token
POOL_PER_KEY = 4  # latest n-grams kept per key token
POOL_KEYS = 4096  # key tokens kept at most: a long generation's pool stays bounded


@dataclass(frozen=True)
class LookaheadGuess:
    """Where a round's guess came from, for the page: the pool, the Jacobi window, or neither."""

    source: str  # "text" (the context's own n-grams), "pool" (the passes' n-grams), "jacobi" or "none"
    tokens: tuple[int, ...]
    window: tuple[int, ...]  # the Jacobi window carried from the last round (its refined guesses)
    pool_size: int  # n-grams in the pool


class Lookahead:
    """Guess from the Jacobi window the last verify pass refined, or from the n-gram pool.

    Args:
        eos_ids: end tokens; a guess stops after one.
        ngram: tokens an n-gram proposes after its key token.
    """

    name = "lookahead"
    label = "lookahead decoding (Jacobi window + n-gram pool, no draft model)"
    wants_hidden = True  # it reads the verify pass's logits (`observe`), not its hidden states

    def __init__(self, eos_ids: Sequence[int] = (), ngram: int = NGRAM) -> None:
        if not isinstance(ngram, int) or isinstance(ngram, bool) or not 1 <= ngram <= 8:
            raise SettingsError("lookahead n-gram", ngram, "a whole number from 1 to 8")
        self.eos_ids = frozenset(eos_ids)
        self.ngram = ngram
        self._pool: dict[int, list[tuple[int, ...]]] = {}  # the passes' predicted runs, by the token before
        self._text: dict[tuple[int, int], tuple[int, ...]] = {}  # the context's own n-grams, by two tokens before
        self._window: tuple[int, ...] = ()  # refined guesses for the tokens after `_window_after`
        self._window_after: tuple[int, ...] = ()  # the context the window follows
        self._seen = 0  # context tokens already put into the pool
        self.last_guess = LookaheadGuess("none", (), (), 0)
        self.picturing = False
        self.last_picture: DraftPicture | None = None

    # ---- the draft interface -------------------------------------------------------------------

    def get_candidates(self, context_ids: Sequence[int], k: int, sampler: SamplerSettings,
                       generator: torch.Generator) -> Draft:
        context = tuple(context_ids)
        self._add_context(context)
        window = self._window if self._window_after == context else ()
        written = self._text.get(context[-2:], ()) if len(context) >= 2 else ()
        pooled = self._from_pool(context[-1]) if context else ()
        # the first that has a guess: what was written, what the passes predicted, the window
        # (the same verify pass checks any of them, so the choice changes only the speed)
        source, tokens = next(((name, found) for name, found in (("text", written), ("pool", pooled),
                                                                 ("jacobi", window)) if found), ("none", ()))
        tokens = self._cut_after_eos(tokens[:k]) if k >= 1 else ()
        self.last_guess = LookaheadGuess(source if tokens else "none", tokens, window, self.pool_size)
        self.last_picture = (DraftPicture(self.name, tokens, (), context[-1], source=source, window=window,
                                          pool=self.pool_for(context[-1]), pool_size=self.pool_size)
                             if self.picturing and tokens else None)
        return Draft(tokens, None) if tokens else NO_DRAFT

    def observe(self, outcome: RoundOutcome) -> None:
        """Keep the pass's predictions: past the first rejected guess they are the next window;
        every run of them is an n-gram for the pool."""
        predicted = tuple(outcome.logits.argmax(dim=-1).tolist())  # row r: the token at before + r
        emitted = outcome.context_ids[len(outcome.context_ids) - outcome.emitted:]
        self._window = predicted[outcome.accepted + 1:] if outcome.emitted == outcome.accepted + 1 else ()
        self._window_after = outcome.context_ids
        before = outcome.context_ids[-outcome.emitted - 1:-outcome.emitted] if len(outcome.context_ids) > \
            outcome.emitted else ()
        self._add_run(before + emitted + self._window)
        # the runs the pass predicted from the guesses: what the model would say after each
        drafted = tuple(outcome.drafted)
        for start in range(len(drafted)):
            self._add_run(drafted[start:start + 1] + predicted[start + 1:])

    def update(self, context_ids: Sequence[int]) -> None:
        """A context the window was not made for (a rewind, a stop cut) drops the window."""
        if tuple(context_ids) != self._window_after:
            self._window = ()

    # ---- the pool --------------------------------------------------------------------------------

    @property
    def pool_size(self) -> int:
        return sum(len(grams) for grams in self._pool.values())

    def pool_for(self, token_id: int) -> tuple[tuple[int, ...], ...]:
        """The pool's n-grams after `token_id`, the latest first (for the page)."""
        return tuple(reversed(self._pool.get(token_id, ())))

    def _add_run(self, run: Sequence[int]) -> None:
        """Every n-gram of `run`: each token as a key, the next `ngram` tokens as its guess."""
        for index in range(len(run) - 1):
            gram = tuple(run[index + 1:index + 1 + self.ngram])
            self._remember(run[index], gram)

    def _remember(self, key: int, gram: tuple[int, ...]) -> None:
        grams = self._pool.setdefault(key, [])
        if gram in grams:
            grams.remove(gram)
        elif any(old[:len(gram)] == gram for old in grams):
            return  # a longer n-gram with the same start already says it
        grams.append(gram)
        del grams[:-POOL_PER_KEY]
        if len(self._pool) > POOL_KEYS:  # the oldest key goes (dicts keep insertion order)
            del self._pool[next(iter(self._pool))]

    def _add_context(self, context: tuple[int, ...]) -> None:
        """The context's own n-grams, keyed by the two tokens before them, the latest kept (the
        prompt's on the first round, then each round's new tokens)."""
        if len(context) > self._seen:
            for end in range(max(2, self._seen - self.ngram), len(context) - 1):
                self._text[context[end - 2:end]] = context[end:end + self.ngram]
                if len(self._text) > POOL_KEYS:
                    del self._text[next(iter(self._text))]
            self._seen = len(context)
        elif len(context) < self._seen:  # rewound: the pool keeps what it learnt, the count follows
            self._seen = len(context)

    def _from_pool(self, key: int) -> tuple[int, ...]:
        grams = self._pool.get(key)
        return max(reversed(grams), key=len) if grams else ()

    def _cut_after_eos(self, proposal: Sequence[int]) -> tuple[int, ...]:
        for index, token in enumerate(proposal):
            if token in self.eos_ids:
                return tuple(proposal[:index + 1])
        return tuple(proposal)
