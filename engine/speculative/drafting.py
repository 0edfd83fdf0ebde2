"""Draft methods for speculative decoding: cheap guesses at the next few tokens.

Every method has one small interface, like transformers' `CandidateGenerator`:
`get_candidates(context, k, sampler, generator)` proposes up to k tokens (with the draft's
own distribution q at each, or none when the guess is deterministic), and `update(context)`
tells it what the context became after the target model checked the guess (a draft model
crops its own KV cache to the tokens that survived). A method never decides what is
emitted: the target model's verify pass does (engine/speculative/generation.py).

- `PromptLookup`: no model at all. Find the context's last few tokens earlier in the context
  and propose what followed them there. Free to compute; good when the answer copies from the
  prompt (quoting, editing a given sentence, code), useless on free-form text.
- `DraftModel`: a second causal LM with the same tokenizer, run one token at a time for k
  steps. Any model works, including a cheaper copy of the target itself (`self_draft`).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from engine.cpu_threads import on_sampler_thread
from engine.errors import ModelLoadError, SettingsError
from engine.forward import crop_cache, forward_one, new_cache
from engine.loading import LoadedModel
from engine.sampling import draw_uniform, pick_by_cdf, run_chain
from engine.settings import SamplerSettings

MAX_NGRAM = 3  # longest suffix prompt lookup tries to find earlier in the context
MIN_NGRAM = 2  # shortest: a single repeated token matches too often on free-form text to pay
SELF_DRAFT_KINDS = ("bfloat16", "int8")


@dataclass(frozen=True)
class Draft:
    """One round's guess: up to k token ids and the draft's distribution q at each."""

    token_ids: tuple[int, ...]
    q: torch.Tensor | None  # [len(token_ids), vocab] the draft's final distributions; None = deterministic

    def q_of(self, index: int) -> float:
        """The probability the draft gave its own token at `index` (1 for a deterministic guess)."""
        return 1.0 if self.q is None else float(self.q[index, self.token_ids[index]])

    def q_row(self, index: int, vocab: int) -> torch.Tensor:
        """The draft's distribution `[vocab]` at `index`: a one-hot for a deterministic guess."""
        if self.q is not None:
            return self.q[index]
        row = torch.zeros(vocab)
        row[self.token_ids[index]] = 1.0
        return row


NO_DRAFT = Draft((), None)
LEADERS = 3  # the draft's leading tokens a picture shows at each guess


@dataclass(frozen=True)
class Leader:
    """One of the draft's leading tokens at a guess."""

    token_id: int
    prob: float  # the draft's own softmax there, over what it reads (its scores, before the sampler)


@dataclass(frozen=True)
class DraftPicture:
    """Inside one round's draft, for the page's picture of the method: each guess and the draft's
    leading tokens where it made it, and what the method made them from. A method sets
    `last_picture` in `get_candidates` while its `picturing` is on (the Step lane), so a race or
    a benchmark pays nothing for it; None for a round without a guess."""

    method: str
    guesses: tuple[int, ...]
    leaders: tuple[tuple[Leader, ...], ...]  # per guess; () where the guess is copied, not scored
    after_token: int  # the context's last token: every guess follows it
    source: str = ""  # lookahead: "text", "pool" or "jacobi", where the guess came from
    window: tuple[int, ...] = ()  # lookahead: the Jacobi window the last verify pass left
    pool: tuple[tuple[int, ...], ...] = ()  # lookahead: the pool's n-grams after `after_token`
    pool_size: int = 0  # lookahead: n-grams in the whole pool
    exit_layer: int | None = None  # early exit: the layers the draft ran
    layers: int | None = None  # early exit: the target's layers, all of which verify
    stopped_unsure: float | None = None  # trained drafts: the last guess's probability, where that ended the draft
    go_on: float | None = None  # trained drafts: the probability at which they guess again


def leaders_of(scores: torch.Tensor, ids: torch.Tensor | None = None) -> tuple[Leader, ...]:
    """The `LEADERS` highest of `scores [V]` with their softmax probabilities; `ids` maps the
    positions to token ids (a draft that reads part of the vocabulary)."""
    probs = scores.float().softmax(dim=-1)
    # a stable sort, not topk: among equal scores (common in a bfloat16 draft's) the first comes
    # first, as the argmax a greedy draft picks by
    values, order = torch.sort(probs, descending=True, stable=True)
    top = order[:LEADERS]
    tokens = top if ids is None else ids[top]
    return tuple(Leader(int(t), float(p)) for t, p in zip(tokens.tolist(), values[:LEADERS].tolist(), strict=True))


@dataclass(frozen=True)
class RoundOutcome:
    """What a round's verify pass showed, for a draft method that learns from it (the loop calls
    `observe` with it after every round when the method sets `wants_hidden`). Row r of `hidden`
    and `logits` is the target's state and scores after the fed tokens up to the round's
    (r-1)-th guess: it predicted the token at context index `len(context before) + r`; the last
    emitted token came from row `emitted - 1`."""

    context_ids: tuple[int, ...]  # the context after the round (the emitted tokens appended)
    hidden: torch.Tensor  # [n + 1, hidden] the target's last hidden state (after the final norm), float32
    logits: torch.Tensor  # [n + 1, vocab] the target's raw logits at the same positions
    drafted: tuple[int, ...]  # the round's n guesses
    accepted: int  # guesses kept
    emitted: int  # tokens the round added to the context (after any stop cut), at least 1


class DraftMethod(Protocol):
    """What the speculative loop asks of a draft method."""

    name: str  # the CLI's and the trace's name for it
    label: str  # for people

    def get_candidates(self, context_ids: Sequence[int], k: int, sampler: SamplerSettings,
                       generator: torch.Generator) -> Draft:
        """Up to `k` tokens to follow `context_ids`."""
        ...

    def update(self, context_ids: Sequence[int]) -> None:
        """The context after the round (the accepted drafts and the target's own token)."""
        ...

    # Optional: a method with `wants_hidden = True` also gets `observe(outcome: RoundOutcome)`
    # after each round, before `update`: the verify pass's hidden states and logits.


# ---- prompt lookup ---------------------------------------------------------------------------


def latest_match(context_ids: Sequence[int], n: int) -> int | None:
    """Where the context's last `n` tokens last occurred earlier in it (the start index), or
    None. An occurrence must leave at least one token after it to propose."""
    length = len(context_ids)
    if n < 1 or length <= n:
        return None
    suffix = list(context_ids[-n:])
    last = suffix[-1]
    # scan back from the latest candidate; comparing the last token first keeps this cheap
    for start in range(length - n - 1, -1, -1):
        if context_ids[start + n - 1] == last and list(context_ids[start:start + n]) == suffix:
            return start
    return None


class PromptLookup:
    """Propose what followed the latest earlier occurrence of the context's last n tokens
    (n from MAX_NGRAM down to MIN_NGRAM). The guess is deterministic: q is a one-hot, so the
    target accepts a guessed token with probability p(token) when sampling.

    Args:
        eos_ids: end tokens; a proposal stops after one (what follows it would never be used).
        max_ngram, min_ngram: the suffix lengths tried, longest first.
    """

    name = "prompt-lookup"
    label = "prompt lookup (no draft model)"

    def __init__(self, eos_ids: Sequence[int] = (), max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> None:
        if not isinstance(min_ngram, int) or not 1 <= min_ngram <= max_ngram:
            raise SettingsError("min_ngram", min_ngram, f"a whole number from 1 to max_ngram ({max_ngram})")
        self.eos_ids = frozenset(eos_ids)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def get_candidates(self, context_ids: Sequence[int], k: int, sampler: SamplerSettings,
                       generator: torch.Generator) -> Draft:
        if k < 1:
            return NO_DRAFT
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            start = latest_match(context_ids, n)
            if start is not None:
                return Draft(self._cut_after_eos(context_ids[start + n:start + n + k]), None)
        return NO_DRAFT

    def update(self, context_ids: Sequence[int]) -> None:
        """Nothing to keep: the context itself is the lookup table."""

    def _cut_after_eos(self, proposal: Sequence[int]) -> tuple[int, ...]:
        for index, token in enumerate(proposal):
            if token in self.eos_ids:
                return tuple(proposal[:index + 1])
        return tuple(proposal)


# ---- a draft model ---------------------------------------------------------------------------


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft model must spell every token the way the target does: same vocabulary (ids and
    strings), same special ids, same end tokens. Raises SettingsError naming the difference."""
    if draft.vocab_size != target.vocab_size:
        raise SettingsError("draft model", draft.name, f"a model with the target's vocabulary of {target.vocab_size:,} "
                            f"tokens (it has {draft.vocab_size:,})")
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise SettingsError("draft model", draft.name, "a model whose tokenizer maps every token to the same id as "
                            f"{target.name}'s (the vocabularies differ)")
    if sorted(draft.tokenizer.all_special_ids) != sorted(target.tokenizer.all_special_ids):
        raise SettingsError("draft model", draft.name, "a model with the target's special token ids "
                            f"{sorted(target.tokenizer.all_special_ids)}")
    if draft.eos_ids != target.eos_ids:
        raise SettingsError("draft model", draft.name, f"a model with the target's end tokens {list(target.eos_ids)}")


def self_draft(target: LoadedModel, kind: str) -> LoadedModel:
    """A cheaper copy of the target to draft with: its weights in bfloat16, or its linear
    layers quantised to int8 (dynamic quantisation, CPU only). Same tokenizer by construction.
    Raises ModelLoadError when the copy cannot be made on this machine."""
    if kind not in SELF_DRAFT_KINDS:
        raise SettingsError("self-draft kind", kind, f"one of {', '.join(SELF_DRAFT_KINDS)}")
    try:
        model = copy.deepcopy(target.model)
        if kind == "bfloat16":
            model = model.to(torch.bfloat16).eval()
            dtype = torch.bfloat16
        else:
            if target.device.type != "cpu":
                raise ModelLoadError("int8 dynamic quantisation runs on the CPU only; the target is on "
                                     f"{target.device}: use the bfloat16 copy.")
            # the decoder's linear layers only: the head stays a float matrix, tied to the embeddings
            with warnings.catch_warnings():  # torch marks its quantised tensor types deprecated; they still work
                warnings.simplefilter("ignore", UserWarning)
                torch.ao.quantization.quantize_dynamic(model.get_decoder(), {torch.nn.Linear}, dtype=torch.qint8,
                                                       inplace=True)
            model = model.eval()
            dtype = target.dtype  # activations stay float32; only the decoder's Linear weights are int8
    except ModelLoadError:
        raise
    except Exception as exc:  # any failure to build the copy is a load failure
        raise ModelLoadError(f"Could not make a {kind} copy of {target.name}: {exc}") from exc
    return replace(target, model=model, dtype=dtype, name=f"{target.name.split(' (')[0]} ({kind} copy)")


@on_sampler_thread
def _draft_pick(logits: torch.Tensor, context_ids: list[int], sampler: SamplerSettings,
                generator: torch.Generator) -> tuple[int, torch.Tensor]:
    """The draft's token and its final distribution q `[vocab]`, through the same sampler chain
    as the target (so q and p are shaped alike) and the generation's own generator."""
    chain = run_chain(logits, torch.tensor(context_ids), sampler)
    q = chain.final_probs
    if chain.greedy_token is not None:
        return chain.greedy_token, q
    token, _ = pick_by_cdf(q, draw_uniform(generator))
    return token, q


class DraftModel:
    """Draft with a second causal LM, one token per forward pass, k passes per round. It keeps
    its own KV cache; after each round the cache is cropped to the tokens that survived.

    Args:
        draft: the draft model (checked: same tokenizer as the target).
        target: the model whose output the drafts must match.
        name: the trace's and the CLI's name for this method.
    """

    def __init__(self, draft: LoadedModel, target: LoadedModel, name: str = "draft-model") -> None:
        check_same_tokenizer(target, draft)
        self.lm = draft
        self.name = name
        self.label = f"draft model: {draft.name}"
        self._cache = new_cache(draft)
        self._cached_ids: list[int] = []  # the tokens whose keys and values the cache holds
        self.picturing = False
        self.last_picture: DraftPicture | None = None

    def get_candidates(self, context_ids: Sequence[int], k: int, sampler: SamplerSettings,
                       generator: torch.Generator) -> Draft:
        self.last_picture = None
        if k < 1:
            return NO_DRAFT
        context = list(context_ids)
        self.update(context)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        leaders: list[tuple[Leader, ...]] = []
        unseen = context[len(self._cached_ids):]
        try:
            for _ in range(k):
                logits = forward_one(self.lm, unseen, self._cache)  # [vocab]
                self._cached_ids += unseen
                token, q = _draft_pick(logits, context + tokens, sampler, generator)
                tokens.append(token)
                rows.append(q)
                if self.picturing:
                    leaders.append(leaders_of(logits))
                if token in self.lm.eos_ids:
                    break
                unseen = [token]
        except BaseException:
            crop_cache(self._cache, len(self._cached_ids))
            raise
        if self.picturing:
            self.last_picture = self._picture(tuple(tokens), tuple(leaders), context[-1])
        return Draft(tuple(tokens), torch.stack(rows))  # q: [len, vocab]

    def _picture(self, tokens: tuple[int, ...], leaders: tuple[tuple[Leader, ...], ...], after: int) -> DraftPicture:
        return DraftPicture(self.name, tokens, leaders, after)

    def release(self) -> None:
        """Drop the draft's KV cache (its generation was closed); the next round would read the
        whole context again."""
        self._cache = new_cache(self.lm)
        self._cached_ids.clear()

    def update(self, context_ids: Sequence[int]) -> None:
        """Crop the cache to the longest prefix it shares with the context, keeping the
        context's last token out (it is fed on the next round, to get its logits)."""
        keep = 0
        limit = min(len(self._cached_ids), len(context_ids) - 1)
        while keep < limit and self._cached_ids[keep] == context_ids[keep]:
            keep += 1
        if keep == 0:
            self._cache = new_cache(self.lm)
        elif keep < len(self._cached_ids):
            crop_cache(self._cache, keep)
        del self._cached_ids[keep:]
