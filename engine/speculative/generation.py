"""Speculative decoding: several tokens per forward pass of the model, the same output.

One round (`SpeculativeGeneration.step` reads as this):
  1. draft: a cheap method guesses the next k tokens (engine/speculative/drafting.py);
  2. verify: ONE forward pass of the target model reads the tokens its cache has not seen
     plus the k guesses, and returns its distribution p at each of the k + 1 positions
     (every guessed position, and the one after the last guess); where it is proven on this
     machine, each row has the digits of the decode step that would read it (engine/forward.py);
  3. accept / reject, left to right (engine/speculative/rule.py): greedy keeps a guess when it is the target's argmax;
     sampling keeps it when a uniform u < min(1, p(x) / q(x)), q being the draft's
     probability of its own guess. The first rejected position instead draws from the
     residual max(0, p - q), renormalised. If all k survive, the k + 1-th distribution gives
     a bonus token. Either way the round adds (accepted guesses) + 1 tokens;
  4. check: the same stop conditions as plain generation, token by token, so a round that
     crosses one ends exactly where plain generation would;
  5. crop: the target's KV cache drops the positions of rejected guesses (and the draft
     model's cache likewise), then the round's record is kept.

Why the output is the target's: greedy keeps only tokens the target would have picked itself.
With sampling, a token x comes out of a position with probability
q(x) min(1, p(x)/q(x)) + P(reject) r(x) = min(q(x), p(x)) + max(0, p(x) - q(x)) = p(x).
The chain is not broken: each accepted token is still conditioned on all before it; the
target only checks k of them in one pass instead of making them in k passes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from engine.cpu_threads import on_sampler_thread
from engine.forward import crop_cache, forward_all, forward_all_hidden
from engine.kvcache import KVSnapshot
from engine.limits import Limits
from engine.loading import LoadedModel
from engine.sampling import ChainOutput, Draw, leading_ids
from engine.settings import SamplerSettings, StopSettings
from engine.shell import GenerationShell
from engine.speculative.drafting import NO_DRAFT, Draft, DraftMethod, RoundOutcome
from engine.speculative.rule import Check, Verdict, check_k, judge, target_chains
from engine.stopping import Termination
from engine.tokens import TokenPiece, TokenTexts

VIEW_TOP_N = 8  # leaders of p and of q kept per position for the page


# ---- the round's record ----------------------------------------------------------------------


@dataclass(frozen=True)
class TokenProbs:
    """One token at one verified position: the target's and the draft's probability of it."""

    token_id: int
    text: str
    p: float  # target, final (after the sampler)
    q: float  # draft (1 / 0 for a deterministic guess)
    residual: float | None = None  # on the rejected position: its share of max(0, p - q) renormalised
    p_raw: float | None = None  # the target's raw softmax here, from the same verify pass (before the sampler)


@dataclass(frozen=True)
class PositionView:
    """The target's distribution at one verified position, beside the draft's."""

    position: int  # the context index this distribution predicts
    drafted_id: int | None  # the guess made for this position; None at the bonus position
    top: tuple[TokenProbs, ...]  # leaders of p, of q (and of the residual), sorted by p
    others_p: float  # the target's probability of every token not in `top`
    reached: bool  # the left-to-right check got here (False after a rejection)
    entropy_bits: float  # of the target's final distribution
    others_p_raw: float | None = None  # the target's raw probability of every token not in `top`


@dataclass(frozen=True)
class Rejection:
    """The first rejected guess and what replaced it."""

    index: int  # 0-based among the drafted tokens
    position: int  # context index
    u: float | None
    accept_prob: float
    residual_mass: float  # sum of max(0, p - q) before renormalising
    token: TokenPiece  # drawn from the residual (greedy: the target's argmax)
    draw: Draw | None


@dataclass(frozen=True)
class KVChange:
    """The target's KV cache through one round: the verify pass writes, the crop removes."""

    before: int  # positions held when the round began
    written: int  # positions the verify pass added (unseen context + drafted tokens)
    cropped: int  # positions removed afterwards (rejected guesses, or tokens past a stop)
    after: int  # positions held when the round ended
    snapshot: KVSnapshot  # the cache after the crop, measured from its tensors


@dataclass(frozen=True)
class RoundTiming:
    draft_ms: float  # proposing the guesses (a draft model's k passes; lookup's search)
    verify_ms: float  # the target's one forward pass
    bookkeeping_ms: float  # sampler chains, accept / reject, stop checks, cache crop, the record
    round_ms: float  # the whole round, wall time


EMITTED_KINDS = ("accepted", "replaced", "bonus", "plain")  # plain: a round with no guess, one decode step


@dataclass(frozen=True)
class RoundRecord:
    """Everything about one speculative round. Round 1 reads the prompt too."""

    index: int
    method: str
    k: int  # tokens asked of the draft: the setting, capped by the room left before a stop
    sampler: SamplerSettings
    drafted: tuple[TokenPiece, ...]  # what the draft proposed (may be fewer than k, or none)
    deterministic_draft: bool  # q is a one-hot (prompt lookup)
    positions: tuple[PositionView, ...]  # len(drafted) + 1 distributions from the one verify pass
    checks: tuple[Check, ...]  # the guesses checked, up to the first rejection
    accepted: int  # guesses kept
    rejection: Rejection | None
    bonus: TokenPiece | None  # the extra token when every guess survived
    emitted: tuple[TokenPiece, ...]  # what joined the context, in order (after any stop cut)
    emitted_kinds: tuple[str, ...]  # per emitted token: one of EMITTED_KINDS
    cut_by_stop: int  # tokens this round decided but dropped because a stop condition fired first
    first_position: int  # the context index of the first emitted token
    fed_tokens: int  # tokens the verify pass read
    kv: KVChange
    termination: Termination
    output_text: str  # the decoded output after the round, before any stop-sequence cut
    timing: RoundTiming

    @property
    def emitted_ids(self) -> tuple[int, ...]:
        return tuple(piece.token_id for piece in self.emitted)


def _token_probs(texts: TokenTexts, ids: Sequence[int], p: torch.Tensor, q: torch.Tensor | None,
                 drafted_id: int | None, residual: torch.Tensor | None, raw: torch.Tensor | None
                 ) -> tuple[TokenProbs, ...]:
    """Rows for `ids`; without a q tensor the draft's guess was deterministic (q = 1 on it)."""
    p_values = p[list(ids)].tolist()
    q_values = q[list(ids)].tolist() if q is not None else [float(i == drafted_id) for i in ids]
    r_values = residual[list(ids)].tolist() if residual is not None else [None] * len(ids)
    raw_values = raw[list(ids)].tolist() if raw is not None else [None] * len(ids)
    rows = [TokenProbs(i, texts.piece(i).text, pv, qv, rv, wv)
            for i, pv, qv, rv, wv in zip(ids, p_values, q_values, r_values, raw_values, strict=True)]
    return tuple(sorted(rows, key=lambda r: (-r.p, -r.q, r.token_id)))


def position_view(texts: TokenTexts, position: int, chain: ChainOutput, draft: Draft, index: int,
                  reached: bool, residual: torch.Tensor | None = None, top_n: int = VIEW_TOP_N,
                  raw: torch.Tensor | None = None) -> PositionView:
    """Verified position `index` for the page: the leaders of p, of the draft's q, of the
    residual and of the target's raw softmax `raw` ([vocab], the verify pass's own, before the
    sampler: under greedy p is a one-hot and says nothing of the model's confidence), with every
    probability, and the rest of p's (and raw p's) mass summed."""
    p = chain.final_probs
    drafted_id = draft.token_ids[index] if index < len(draft.token_ids) else None
    q = draft.q[index] if draft.q is not None and drafted_id is not None else None  # [vocab]
    # under greedy the residual is p's own one-hot (rule.py `_greedy_residual`): no other leaders
    residual_leaders = leading_ids(residual, top_n) if residual is not None and chain.greedy_token is None else []
    ids = dict.fromkeys(chain.leaders(top_n) + (leading_ids(q, top_n) if q is not None else [])
                        + residual_leaders + (leading_ids(raw, top_n) if raw is not None else [])
                        + ([drafted_id] if drafted_id is not None else []))
    top = _token_probs(texts, list(ids), p, q, drafted_id, residual, raw)
    others_raw = max(0.0, 1.0 - sum(row.p_raw for row in top)) if raw is not None else None
    return PositionView(position, drafted_id, top, max(0.0, 1.0 - sum(row.p for row in top)), reached,
                        chain.final_entropy_bits, others_raw)


# ---- the generation --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Checkpoint:
    cache_length: int
    rng_state: torch.Tensor
    started: float  # perf_counter at the round's start


@dataclass(frozen=True)
class _Verified:
    """What the draft and the verify pass returned, for the rest of the round."""

    context: list[int]  # the context before the round
    room: int  # guesses asked for: k, capped by the room left before a stop
    draft: Draft
    logits: torch.Tensor  # [len(draft) + 1, vocab]
    fed: int  # tokens the verify pass read
    draft_ms: float
    verify_ms: float
    hidden: torch.Tensor | None = None  # [len(draft) + 1, hidden] where the draft method reads it


class SpeculativeGeneration(GenerationShell):
    """One visitor's speculative generation: the context, the target's KV cache, the random
    generator, the draft method and the record of every round. Not shared between threads.

    Args:
        lm: the target model.
        prompt, chat, system_prompt, sampler, stop, allow_special, limits: as for every
            generation (engine/shell.py `GenerationShell`); sampler and stop may be changed
            between rounds.
        draft: the draft method (engine/speculative/drafting.py); may be changed between rounds.
        k: tokens drafted per round, 1 to 8; may be changed between rounds.
        seed: seeds this generation's own torch.Generator (the draft's draws, the u of each
            check, the residual and bonus draws all come from it).
    """

    def __init__(self, lm: LoadedModel, prompt: str, *, draft: DraftMethod, k: int = 4, chat: bool = False,
                 system_prompt: str | None = None, sampler: SamplerSettings | None = None,
                 stop: StopSettings | None = None, seed: int = 0, allow_special: bool = False,
                 limits: Limits | None = None) -> None:
        super().__init__(lm, prompt, chat=chat, system_prompt=system_prompt, sampler=sampler, stop=stop, seed=seed,
                         allow_special=allow_special, limits=limits)
        self.k = check_k(k)
        self.draft = draft
        self._generated: list[int] = []
        self._rounds: list[RoundRecord] = []
        self._last_eos_prob = 0.0

    # ---- what the pages read -------------------------------------------------------------------

    @property
    def rounds(self) -> tuple[RoundRecord, ...]:
        return tuple(self._rounds)

    @property
    def generated_ids(self) -> list[int]:
        return list(self._generated)

    def _latest_eos_prob(self) -> float:
        return self._last_eos_prob

    @property
    def forward_passes(self) -> int:
        """Forward passes of the target model so far: one per round."""
        return len(self._rounds)

    @property
    def drafted_count(self) -> int:
        """Tokens the draft proposed over every round."""
        return sum(len(r.drafted) for r in self._rounds)

    @property
    def acceptance_rate(self) -> float | None:
        """Guesses kept / guesses checked, over every round (None before any guess)."""
        checked = sum(len(r.checks) for r in self._rounds)
        return sum(r.accepted for r in self._rounds) / checked if checked else None

    def close(self) -> None:
        """Release this generation's memory: its KV cache and its draft's (a draft model keeps
        one). The rounds stay readable; it cannot step again."""
        super().close()
        if callable(release := getattr(self.draft, "release", None)):
            release()

    # ---- the loop ------------------------------------------------------------------------------

    def run(self, max_rounds: int | None = None) -> Iterator[RoundRecord]:
        """Rounds until a stop condition fires (or `max_rounds`), yielding each record."""
        return super().run(max_rounds)

    def set_k(self, k: object) -> None:
        """Tokens drafted from the next round on (1 to 8); a bad value changes nothing."""
        self.k = check_k(k)

    def step(self) -> RoundRecord:
        """One round: draft, verify in one pass, accept / reject, check, crop, record. Atomic:
        if anything fails, the context, the caches and the random generator are as before."""
        self._check_open("Reset to start again")
        before = _Checkpoint(self._cache.get_seq_length(), self._generator.get_state(), time.perf_counter())
        try:
            context = self.context_ids
            room = self._room(context)
            draft, draft_ms = self._propose(context, room)  # 1. draft
            unseen = context[before.cache_length:] + list(draft.token_ids)
            verify_started = time.perf_counter()
            keep = len(draft.token_ids) + 1
            if self._wants_hidden():  # 2. verify [n+1, vocab], and the states a draft learns from
                logits, hidden = forward_all_hidden(self.lm, unseen, self._cache, keep)
            else:
                logits, hidden = forward_all(self.lm, unseen, self._cache, keep=keep), None
            verified = _Verified(context, room, draft, logits, len(unseen), draft_ms,
                                 (time.perf_counter() - verify_started) * 1e3, hidden)
            record = self._settle(verified, before)  # 3. accept / reject, 4. check, 5. crop and record
        except BaseException:
            crop_cache(self._cache, before.cache_length)
            self._generator.set_state(before.rng_state)
            self.draft.update(self.context_ids)
            raise
        return record

    # ---- inside a round ------------------------------------------------------------------------

    def _room(self, context: list[int]) -> int:
        """Guesses worth making: a round adds up to k + 1 tokens, and must not pass the
        max-new-tokens cap or the context window."""
        left_new = self.stop.max_new_tokens - len(self._generated)
        left_window = self.lm.context_window - len(context)
        return max(0, min(self.k, left_new - 1, left_window - 1))

    def _wants_hidden(self) -> bool:
        return bool(getattr(self.draft, "wants_hidden", False))

    def _propose(self, context: list[int], room: int) -> tuple[Draft, float]:
        started = time.perf_counter()
        draft = self.draft.get_candidates(context, room, self.sampler, self._generator) if room else NO_DRAFT
        return draft, (time.perf_counter() - started) * 1e3

    def _settle(self, verified: _Verified, before: _Checkpoint) -> RoundRecord:
        """Accept / reject, apply the stop conditions, crop the caches and keep the record."""
        bookkeeping_started = time.perf_counter()
        verdict, eos_probs, positions = _verify(verified.logits, verified.context, verified.draft, self.sampler,
                                                self._generator, self.lm.eos_ids, self.lm.texts)  # 3
        emitted, text, termination = self._stop_within(verdict.emitted, eos_probs)  # 4
        self._generated += emitted
        self._text_cache = (len(self._generated), text)
        self._last_eos_prob = termination.eos_prob
        crop_cache(self._cache, len(self.context_ids) - 1)  # 5. the last token is read next round
        if verified.hidden is not None:
            self.draft.observe(RoundOutcome(tuple(self.context_ids), verified.hidden, verified.logits,
                                            verified.draft.token_ids, verdict.accepted, len(emitted)))
        self.draft.update(self.context_ids)
        held = self._cache.get_seq_length()
        kv = KVChange(before.cache_length, verified.fed, before.cache_length + verified.fed - held, held, self.kv)
        record = self._record(verified, verdict, positions, emitted, termination, text, kv)
        bookkeeping_ms = (time.perf_counter() - bookkeeping_started) * 1e3
        record = replace(record, timing=RoundTiming(verified.draft_ms, verified.verify_ms, bookkeeping_ms,
                                                    (time.perf_counter() - before.started) * 1e3))
        self._rounds.append(record)
        return record

    def _stop_within(self, emitted: tuple[int, ...], eos_probs: Sequence[float]
                     ) -> tuple[list[int], str, Termination]:
        """The round's tokens up to the first one after which plain generation would stop."""
        for count in range(1, len(emitted) + 1):
            generated = self._generated + list(emitted[:count])
            text = self._decode(generated)
            termination = self._termination(generated, text, eos_probs[count - 1])
            if termination.finish_reason is not None or count == len(emitted):
                return list(emitted[:count]), text, termination
        raise AssertionError("a round always emits at least one token")

    def _record(self, verified: _Verified, verdict: Verdict, positions: tuple[PositionView, ...], emitted: list[int],
                termination: Termination, text: str, kv: KVChange) -> RoundRecord:
        texts, context, draft = self.lm.texts, verified.context, verified.draft
        n = len(draft.token_ids)
        rejection = None
        if verdict.rejected:
            check = verdict.checks[-1]
            rejection = Rejection(check.index, len(context) + check.index, check.u, check.accept_prob,
                                  verdict.residual_mass, texts.piece(verdict.token_id), verdict.draw)
        kinds = (["accepted"] * verdict.accepted + ["replaced" if verdict.rejected else "bonus"]) if n else ["plain"]
        return RoundRecord(
            index=len(self._rounds) + 1, method=self.draft.name, k=verified.room,
            sampler=self.sampler, drafted=tuple(texts.piece(i) for i in draft.token_ids),
            deterministic_draft=draft.q is None, positions=positions, checks=verdict.checks,
            accepted=verdict.accepted, rejection=rejection,
            bonus=None if verdict.rejected else texts.piece(verdict.token_id),
            emitted=tuple(texts.piece(i) for i in emitted), emitted_kinds=tuple(kinds[:len(emitted)]),
            cut_by_stop=len(verdict.emitted) - len(emitted), first_position=len(context), fed_tokens=verified.fed,
            kv=kv, termination=termination, output_text=text, timing=RoundTiming(0.0, 0.0, 0.0, 0.0))


@on_sampler_thread
def _verify(logits: torch.Tensor, context: list[int], draft: Draft, sampler: SamplerSettings,
            generator: torch.Generator, eos_ids: tuple[int, ...], texts: TokenTexts
            ) -> tuple[Verdict, list[float], tuple[PositionView, ...]]:
    """The sampler's part of a round, in one hop to the sampler's worker: the chain at each
    verified position, the accept / reject rule, the raw end-token probability at each, and
    each position's view for the page (every op over the vocabulary is here, on one thread)."""
    chains = target_chains(logits, context, draft.token_ids, sampler)
    verdict = judge(chains, draft, sampler, generator)
    raw = logits.softmax(dim=-1)  # [n + 1, vocab]: the model's own softmax at each verified position
    eos_probs = raw[:, list(eos_ids)].double().sum(dim=-1).tolist() if eos_ids else [0.0] * logits.shape[0]
    return verdict, eos_probs, _position_views(texts, len(context), verdict, draft, raw)


def _position_views(texts: TokenTexts, first: int, verdict: Verdict, draft: Draft, raw: torch.Tensor
                    ) -> tuple[PositionView, ...]:
    """Every verified position's view; `first` is the context index the first one predicts."""
    n = len(draft.token_ids)
    reached = len(verdict.checks)  # positions 0..reached-1 checked; the bonus position if none rejected
    return tuple(
        position_view(texts, first + i, verdict.chains[i], draft, i,
                      reached=i < reached or (i == n and not verdict.rejected),
                      residual=verdict.residual if verdict.rejected and i == verdict.accepted else None,
                      raw=raw[i])
        for i in range(n + 1))
