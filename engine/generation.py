"""The autoregressive loop, one token at a time, with a record of everything at each step.

One step is the four stages of the loop, then its record (`Generation.step` reads as this):
  1. forward pass: feed the tokens the KV cache has not seen yet (the whole prompt on the
     first step, then the previous pick) and read the logits at the last position;
  2. sample: softmax over the whole vocabulary, the sampler chain, the pick;
  3. append: the pick joins the context (its keys and values enter the cache on the next
     forward pass, when the model reads it);
  4. check: EOS, stop sequences, max new tokens, context window;
  5. record: every number of the step, kept with its logits for re-sampling and rewinding.

Memory per visitor is bounded: the raw logits (49,152 floats, 192 KiB a step for SmolLM2) are
kept for the latest KEEP_LOGITS steps only. An older step's logits are computed again when
asked for (re-sampling it, going Back to it): one forward pass of that step's token over the
KV cache's prefix, which repeats the step's own pass. Every record stays.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from engine.cpu_threads import on_sampler_thread
from engine.errors import GenerationFinished, SettingsError
from engine.forward import cache_prefix, crop_cache, forward_one, new_cache
from engine.inside import Capture, InsideView, inside_pass, inside_view
from engine.kvcache import KVSnapshot
from engine.limits import Limits
from engine.loading import LoadedModel
from engine.sampling import (
    DRAW_METHODS,
    ChainOutput,
    Decision,
    DrawStrategy,
    InverseCdf,
    Multinomial,
    decide,
    draw_uniform,
    entropy_bits,
)
from engine.settings import SamplerSettings, StopSettings, is_whole
from engine.shell import GenerationShell, PassQueue
from engine.stopping import Termination
from engine.tokens import TokenPiece

if TYPE_CHECKING:
    from concurrent.futures import Future

    from transformers import DynamicCache

TOP_N = 50  # candidates recorded per step, by raw probability
FINAL_TOP_N = 10  # the final distribution's leaders are always among them
KEEP_LOGITS = 8  # latest steps whose raw logits are kept; older ones are computed again when asked for
KEEP_INSIDE = 2  # latest steps whose inside-the-pass captures are kept (~1 KB a position each, with attention)
RNG_BLOCK = 64  # bytes per block of a kept generator state


@dataclass(frozen=True, slots=True)  # slots: a step records ~60 of these
class Candidate:
    """One token the model could have picked at this step."""

    token_id: int
    text: str
    logit: float  # raw model output
    prob: float  # softmax of the raw logits
    final_prob: float  # probability in the distribution actually sampled from
    rank: int  # place by raw probability, 1 = most probable


@dataclass(frozen=True)
class Distribution:
    """The next-token distribution at one step: the leaders and a summary of the rest."""

    top: tuple[Candidate, ...]  # sorted by raw probability
    raw_entropy_bits: float
    final_entropy_bits: float
    others_count: int  # tokens not in `top`
    others_prob: float  # their raw probability mass
    others_final_prob: float  # their final probability mass


@dataclass(frozen=True)
class Timing:
    forward_ms: float  # the pass whose logits the step used (a step taken again reuses its pass)
    sampling_ms: float  # sampler chain, draw and the distribution summary
    step_ms: float  # the whole step, wall time


@dataclass(frozen=True)
class StepRecord:
    """Everything about one step of generation. Step 1 makes the first new token."""

    index: int
    position: int  # the new token's place in the context, 0-based
    token: TokenPiece
    logit: float
    prob: float  # raw softmax probability of the pick
    rank: int  # the pick's place by raw probability
    final_prob: float
    decision: Decision
    distribution: Distribution
    kv: KVSnapshot  # the cache after this step's forward pass
    forward_tokens: int  # tokens that pass read: the prompt on step 1, then 1
    termination: Termination
    timing: Timing

    @property
    def token_id(self) -> int:
        return self.token.token_id


@dataclass(frozen=True)
class Resampled:
    """A step's logits run through other sampler settings: no forward pass."""

    decision: Decision
    distribution: Distribution


@dataclass(frozen=True)
class _Sampled:
    """What the sampler stage returns to the loop."""

    decision: Decision
    raw_probs: torch.Tensor  # [vocab], softmax of the raw logits
    raw_rank: int  # the pick's place by raw logit (1 = the highest; ties share the better place)
    distribution: Distribution
    eos_prob: float  # raw probability of every end token together
    sampling_ms: float  # the chain, the draw and the distribution summary


@dataclass(frozen=True)
class _PendingLogits:
    """Logits kept from an earlier forward pass, for the next step to use again."""

    logits: torch.Tensor  # [vocab]
    forward_tokens: int  # what that pass read
    forward_ms: float


@dataclass(frozen=True)
class PromptReading:
    """The prompt's pass read ahead of the first step: how long since it was queued (waiting
    behind other visitors' passes included), and whether it has finished."""

    tokens: int
    elapsed_s: float
    done: bool


@dataclass
class _PromptAhead:
    """The prompt's pass, queued before the first step on a cache of its own (the generation's
    own cache stays empty until step 1 adopts this one)."""

    future: Future  # the scheduler's: next-token logits [vocab]
    cache: DynamicCache
    started: float  # perf_counter when it was queued
    finished: float | None = None  # set by the scheduler's worker when the pass ends


@dataclass(frozen=True)
class _Checkpoint:
    """The generation's mutable state before a step, to undo a step that fails part-way."""

    cache: DynamicCache
    cache_length: int
    rng_state: torch.Tensor
    pending: _PendingLogits | None
    ahead: _PromptAhead | None
    started: float  # perf_counter at the step's start


@dataclass(frozen=True)
class _RngState:
    """A torch.Generator's state (5,056 bytes on the CPU) kept in blocks, each block shared with
    the previous step's state where they are equal: between two draws little of it changes,
    so a step keeps ~1 KB instead of 5."""

    blocks: tuple[bytes, ...]

    @classmethod
    def of(cls, state: torch.Tensor, previous: _RngState | None) -> _RngState:
        data = state.numpy().tobytes()
        blocks = tuple(data[i:i + RNG_BLOCK] for i in range(0, len(data), RNG_BLOCK))
        if previous is not None and len(previous.blocks) == len(blocks):
            blocks = tuple(old if old == new else new for old, new in zip(previous.blocks, blocks, strict=True))
        return cls(blocks)

    def tensor(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(b"".join(self.blocks)), dtype=torch.uint8)


@dataclass(frozen=True)
class _StepTensors:
    """What a step needs kept to be re-sampled or rewound to; never serialised."""

    raw_logits: torch.Tensor | None  # [vocab], float32; None once the step is older than KEEP_LOGITS
    rng_state: _RngState  # the generator's state before the step's draw


def describe_distribution(lm: LoadedModel, raw_logits: torch.Tensor, raw_probs: torch.Tensor,
                          chain: ChainOutput, top_n: int = TOP_N, always: tuple[int, ...] = ()) -> Distribution:
    """The leaders by raw probability (plus the final distribution's leaders, and the tokens in
    `always`: the step's pick and the sampler's own, wherever they rank) and the rest."""
    leader_logits, leader_ids = torch.topk(raw_logits, min(top_n, raw_logits.numel()))
    ids, logits = leader_ids.tolist(), leader_logits.tolist()  # sorted, highest first
    # every token that beats a leader is a leader, so a leader's rank is its first tie's place
    ranks = [logits.index(value) + 1 for value in logits]
    leader_set = set(ids)
    extras = chain.leaders(FINAL_TOP_N)  # no zero "leaders"
    for extra in dict.fromkeys([*extras, *always]):
        if extra not in leader_set:
            leader_set.add(extra)
            ids.append(extra)
            logits.append(float(raw_logits[extra]))
            ranks.append(int((raw_logits > raw_logits[extra]).sum()) + 1)
    index = torch.tensor(ids)
    probs, finals = raw_probs[index].tolist(), chain.final_probs[index].tolist()
    top = tuple(sorted((Candidate(i, lm.texts.piece(i).text, lg, p, fp, r)
                        for i, lg, p, fp, r in zip(ids, logits, probs, finals, ranks, strict=False)),
                       key=lambda c: (c.rank, c.token_id)))
    return Distribution(
        top=top,
        raw_entropy_bits=entropy_bits(raw_probs),
        final_entropy_bits=chain.final_entropy_bits,
        others_count=raw_logits.numel() - len(top),
        others_prob=_rest_mass(raw_probs, index),
        others_final_prob=_rest_mass(chain.final_probs, index),
    )


def _rest_mass(probs: torch.Tensor, leaders: torch.Tensor) -> float:
    """The probability of every token but `leaders`, summed: not 1 minus the leaders', which
    misses a rest of exactly 0 (a sampler that keeps leaders only) by the float32 probabilities'
    rounding. The leaders are zeroed in a float64 copy, which costs a fraction of a boolean mask."""
    rest = probs.to(torch.float64)
    rest[leaders] = 0.0
    return float(rest.sum())


class Generation(GenerationShell):
    """One visitor's generation: the context, the KV cache, the random generator and the
    record of every step. Not shared between threads; the model is.

    Args:
        lm, prompt, chat, system_prompt, sampler, stop, seed, allow_special, limits: as for
            every generation (engine/shell.py `GenerationShell`).
        draw: "cdf" (default) draws one uniform u per step and picks the token whose band
            of the cumulative distribution holds it; "multinomial" draws as
            torch.multinomial does, so a seed reproduces `torch.manual_seed(seed)` followed
            by `generate(do_sample=True)` token for token.
        scheduler: the forward-pass queue shared by every generation on this model (the
            server's, engine/serving/scheduler.py); without one, each pass runs at once on
            the calling thread.
    """

    def __init__(self, lm: LoadedModel, prompt: str, *, chat: bool = False,
                 system_prompt: str | None = None, sampler: SamplerSettings | None = None,
                 stop: StopSettings | None = None, seed: int = 0, draw: str = "cdf",
                 allow_special: bool = False, limits: Limits | None = None,
                 scheduler: PassQueue | None = None) -> None:
        if not isinstance(draw, str) or draw not in DRAW_METHODS:
            raise SettingsError("draw", draw, f"one of {', '.join(DRAW_METHODS)}")
        super().__init__(lm, prompt, chat=chat, system_prompt=system_prompt, sampler=sampler, stop=stop, seed=seed,
                         allow_special=allow_special, limits=limits)
        self.draw = draw
        self.scheduler = scheduler
        self._steps: list[StepRecord] = []
        self._kept: list[_StepTensors] = []
        self._pending: _PendingLogits | None = None  # kept logits the next step uses instead of a pass
        self._ahead: _PromptAhead | None = None  # the prompt's pass queued before step 1 (read_prompt_ahead)
        # look inside each step's own pass (engine/inside.py): it then runs on the model's
        # instrumented twin on this thread, with the model's own numbers; off, nothing is captured
        self.inside = False
        self._captures: dict[int, Capture] = {}  # step position -> what its pass showed (the latest KEEP_INSIDE)
        self._capture: Capture | None = None  # the capture of the pass just made, until its step is recorded

    # ---- what the pages read -------------------------------------------------------------

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        return tuple(self._steps)

    @property
    def generated_ids(self) -> list[int]:
        return [s.token_id for s in self._steps]

    def _latest_eos_prob(self) -> float:
        return self._steps[-1].termination.eos_prob


    def inside_view(self, index: int | None = None) -> InsideView:
        """Inside a step's forward pass (the latest by default): the logit lens per layer, the fed
        token's attention per query head, time and bytes per layer (engine/inside.py). From the
        step's own pass where `inside` was on for it; otherwise its pass is repeated on the
        instrumented twin (over a prefix of the cache, as re-sampling an old step does) and used
        only if it gives the step's own logits, bit for bit."""
        position = self._step_position(index)
        if self._closed:
            raise GenerationFinished.closed()
        capture = self._captures.get(position)
        logits = self._logits_at(position)
        if capture is None:
            capture = self._repeat_inside(position, logits)
        return inside_view(self.lm, capture, logits, self._steps[position].token_id, position + 1)

    def _repeat_inside(self, position: int, logits: torch.Tensor) -> Capture:
        if position == 0:
            repeated, capture = inside_pass(self.lm, self.prompt_ids, new_cache(self.lm))
        else:
            fed = len(self.prompt_ids) + position - 1
            repeated, capture = inside_pass(self.lm, [self.context_ids[fed]], cache_prefix(self._cache, fed))
        if not torch.equal(repeated, logits):
            raise SettingsError("step", position + 1, "a step whose pass can be repeated here with its own logits "
                                "(this one's logits differ: look inside while stepping instead)")
        self._captures[position] = capture
        self._forget_old_captures()
        return capture

    def _keep_capture(self, position: int) -> None:
        """The capture of the pass the step at `position` used (none: `inside` was off, or the
        step reused an earlier pass's logits), kept for its latest KEEP_INSIDE steps only."""
        capture, self._capture = self._capture, None
        if capture is not None:
            self._captures[position] = capture
        self._forget_old_captures()

    def _forget_old_captures(self) -> None:
        keep = set(sorted(self._captures)[-KEEP_INSIDE:])
        self._captures = {p: c for p, c in self._captures.items() if p in keep and p < len(self._steps)}

    def raw_logits(self, index: int | None = None) -> torch.Tensor:
        """A step's raw logits `[vocab]` (a copy); the latest step by default."""
        return self._logits_at(self._step_position(index)).clone()

    # ---- the loop --------------------------------------------------------------------------

    def step(self, force_token_id: int | None = None) -> StepRecord:
        """Run one step of the loop and return its record.

        `force_token_id` replaces the sampler's pick (a branch); the sampler still runs and
        its own choice is recorded beside the forced one. A step is atomic: if anything in
        it fails, the context, the KV cache, the random generator and the records are as
        they were before it.
        """
        self._check_can_step(force_token_id)
        before = self._checkpoint()
        try:
            logits, fed, forward_ms = self._forward_pass()  # 1. forward pass: logits [vocab]
            sampled = self._sample(logits, torch.tensor(self.context_ids), self.sampler,  # 2. sample
                                   self._generator, force_token_id)
            generated, text = self._appended(sampled.decision.token_id)  # 3. append
            termination = self._termination(generated, text, sampled.eos_prob)  # 4. check
            return self._record(sampled, logits, before, fed, forward_ms, termination, text)  # 5. record
        except BaseException:
            self._restore(before)
            raise

    def resample(self, sampler: SamplerSettings, index: int | None = None) -> Resampled:
        """Re-run only the sampler chain on a step's kept logits, with other settings.

        Uses the same random number the step drew (or would have drawn), so the result is
        exactly what that step would have picked under `sampler`. No forward pass.
        """
        if not isinstance(sampler, SamplerSettings):
            raise SettingsError("sampler", sampler, "a SamplerSettings")
        position = self._step_position(index)
        logits = self._logits_at(position)
        context = torch.tensor(self.prompt_ids + self.generated_ids[:position])
        generator = torch.Generator(device="cpu")
        generator.set_state(self._kept[position].rng_state.tensor())
        sampled = self._sample(logits, context, sampler, generator)
        return Resampled(sampled.decision, sampled.distribution)

    def rewind(self, steps_to_keep: int) -> None:
        """Go back to just after step `steps_to_keep` (0 = only the prompt).

        The KV cache is cropped, not recomputed; the random generator returns to its state
        at that point, so stepping again repeats what happened unless settings change.
        """
        if not is_whole(steps_to_keep) or not 0 <= steps_to_keep <= len(self._steps):
            raise SettingsError("steps_to_keep", steps_to_keep, f"a whole number from 0 to {len(self._steps)}")
        if steps_to_keep == len(self._steps):
            return
        self._generator.set_state(self._kept[steps_to_keep].rng_state.tensor())
        self._rewind_cache(steps_to_keep)
        del self._steps[steps_to_keep:]
        del self._kept[steps_to_keep:]
        self._forget_old_captures()

    def branch(self, token_id: int) -> StepRecord:
        """Replace the latest step's pick with `token_id` (the sampler's own choice is still
        recorded): the step is taken again from the same logits, with that token forced."""
        self._step_position(None)
        self._check_token_id("token_id", token_id)
        return self._retake_latest(token_id)

    def repick(self) -> StepRecord:
        """Take the latest step again under the current sampler settings (same logits, same
        random draw), as if those settings had been in force then."""
        self._step_position(None)
        return self._retake_latest(None)

    def read_prompt_ahead(self) -> None:
        """Queue the prompt's forward pass now, so that the first step finds it done: a visitor
        reads the page before pressing Step, and a class that opens a link together has its
        prompts read while it reads. The pass fills a cache of its own; the generation's cache
        stays empty (and `kv` says so) until step 1 adopts it and reports it as its own pass,
        the whole prompt with the pass's time. Only with a scheduler, before the first step;
        once under way, calling again does nothing."""
        started = self._steps or self._ahead is not None or self._pending is not None
        if self.scheduler is None or self._closed or started:
            return
        cache = new_cache(self.lm)
        ahead = _PromptAhead(self.scheduler.submit(list(self.prompt_ids), cache), cache, time.perf_counter())
        ahead.future.add_done_callback(lambda _: setattr(ahead, "finished", time.perf_counter()))
        self._ahead = ahead

    @property
    def reading_ahead(self) -> bool:
        """Whether the prompt's pass was queued ahead of the first step and not yet adopted."""
        return self._ahead is not None

    def prompt_reading(self) -> PromptReading | None:
        """The prompt's pass read ahead, while the first step has not adopted it; None otherwise."""
        ahead = self._ahead
        if ahead is None:
            return None
        done = ahead.future.done()
        until = ahead.finished if done and ahead.finished is not None else time.perf_counter()
        return PromptReading(len(self.prompt_ids), until - ahead.started, done)

    def stop_reading_ahead(self) -> None:
        """Withdraw the prompt's pass read ahead, if it has not started (a visitor who changed
        the prompt: the new generation reads its own); the first step reads the prompt itself."""
        if self._ahead is not None and self.scheduler is not None:
            self.scheduler.cancel(self._ahead.cache)
        self._ahead = None

    def close(self) -> None:
        """Release this generation's memory: its queued passes are withdrawn from the scheduler,
        its KV cache and kept logits are dropped. The records stay readable; it cannot step again."""
        if self.scheduler is not None:
            self.scheduler.cancel(self._cache)
        self.stop_reading_ahead()
        super().close()
        self._pending = None
        self._kept = [_StepTensors(None, kept.rng_state) for kept in self._kept]
        self._captures, self._capture = {}, None

    # ---- inside a step ---------------------------------------------------------------------

    def _check_can_step(self, force_token_id: int | None) -> None:
        self._check_open("go Back, change the stop settings, or Reset")
        if force_token_id is not None:
            self._check_token_id("force_token_id", force_token_id)

    def _check_token_id(self, parameter: str, token_id: object) -> None:
        if not is_whole(token_id) or not 0 <= token_id < self.lm.vocab_size:
            raise SettingsError(parameter, token_id, f"a token id, a whole number from 0 to {self.lm.vocab_size - 1}")

    def _checkpoint(self) -> _Checkpoint:
        return _Checkpoint(self._cache, self._cache.get_seq_length(), self._generator.get_state(), self._pending,
                           self._ahead, time.perf_counter())

    def _restore(self, checkpoint: _Checkpoint) -> None:
        """Undo a step that failed part-way: the cache loses what its forward pass wrote (a
        prompt read ahead goes back to waiting for the next step)."""
        self._cache = checkpoint.cache
        crop_cache(self._cache, checkpoint.cache_length)
        self._generator.set_state(checkpoint.rng_state)
        self._pending = checkpoint.pending
        self._ahead = checkpoint.ahead
        self._capture = None

    def _forward_pass(self) -> tuple[torch.Tensor, int, float]:
        """Logits `[vocab]` for the next position, the tokens fed and the pass's time: a forward
        pass over the tokens the cache has not seen (the whole prompt on the first step, then
        the previous pick), or the kept logits of a pass already made for this position (the
        step is being taken again), reported with that pass's size and time. The first step
        adopts the prompt's pass read ahead, if there is one (waiting for it if need be)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending.logits, pending.forward_tokens, pending.forward_ms
        if self._ahead is not None:
            ahead = self._ahead
            try:
                logits = ahead.future.result()
            except Exception:  # it failed or was withdrawn: the prompt is read below, as without it
                self._ahead = None
            else:
                self._ahead, self._cache = None, ahead.cache
                finished = ahead.finished if ahead.finished is not None else time.perf_counter()
                return logits, len(self.prompt_ids), (finished - ahead.started) * 1e3
        unseen = self.context_ids[self._cache.get_seq_length():]
        started = time.perf_counter()
        logits = self._pass(unseen, self._cache, look_inside=self.inside)
        return logits, len(unseen), (time.perf_counter() - started) * 1e3

    def _pass(self, token_ids: list[int], cache: DynamicCache, look_inside: bool = False) -> torch.Tensor:
        """The next-token logits `[vocab]` after `token_ids` are read into `cache`: in the
        server's queue where there is one (the pass may be packed with other visitors'), else
        at once on this thread; `look_inside`: on the instrumented twin, keeping what it showed."""
        if look_inside:
            logits, self._capture = inside_pass(self.lm, token_ids, cache)
            return logits
        if self.scheduler is not None:
            return self.scheduler.forward(token_ids, cache)
        return forward_one(self.lm, token_ids, cache)

    def _logits_at(self, position: int) -> torch.Tensor:
        """Step `position + 1`'s raw logits `[vocab]`: kept, or computed again by repeating the
        step's pass (the prompt into a fresh cache for step 1; otherwise the step's input token
        over a prefix of the KV cache, which is shared, not copied) and kept again."""
        kept = self._kept[position]
        if kept.raw_logits is not None:
            return kept.raw_logits
        if self._closed:
            raise GenerationFinished.closed()
        if position == 0:
            logits = self._pass(self.prompt_ids, new_cache(self.lm))
        else:
            fed = len(self.prompt_ids) + position - 1  # step position + 1 read the token at this place
            logits = self._pass([self.context_ids[fed]], cache_prefix(self._cache, fed))
        self._kept[position] = _StepTensors(logits, kept.rng_state)
        return logits

    def _forget_old_logits(self) -> None:
        """Drop the raw logits of every step but the latest KEEP_LOGITS (including any computed
        again for an older step since the last step)."""
        for position in range(len(self._kept) - KEEP_LOGITS):
            if self._kept[position].raw_logits is not None:
                self._kept[position] = _StepTensors(None, self._kept[position].rng_state)

    @on_sampler_thread
    def _sample(self, raw_logits: torch.Tensor, context: torch.Tensor, sampler: SamplerSettings,
                generator: torch.Generator, force_token_id: int | None = None) -> _Sampled:
        """The sampler's decision, the raw softmax and the distribution summary. The one place
        a step or a re-sample enters the sampler: it runs on the sampler's one-thread worker
        (engine/cpu_threads.py), so every caller gets the same digits."""
        started = time.perf_counter()
        decision, chain = decide(raw_logits, context, sampler, self._draw_strategy(generator), force_token_id)
        raw_probs = raw_logits.softmax(dim=-1)
        eos_prob = float(raw_probs[list(self.lm.eos_ids)].double().sum()) if self.lm.eos_ids else 0.0
        # the pick has its own row wherever it ranks: a draw far down the tail must stay visible
        distribution = describe_distribution(self.lm, raw_logits, raw_probs, chain,
                                             always=(decision.token_id, decision.sampler_token_id))
        # here, not on the caller's thread: an op over the vocabulary there would start a thread team of its own
        raw_rank = int((raw_logits > raw_logits[decision.token_id]).sum()) + 1
        return _Sampled(decision, raw_probs, raw_rank, distribution, eos_prob, (time.perf_counter() - started) * 1e3)

    def _draw_strategy(self, generator: torch.Generator) -> DrawStrategy:
        """How this generation draws. A sampling step always consumes its draw, forced or
        not, so the random stream stays the same whatever the visitor forces."""
        if self.draw == "multinomial":
            return Multinomial(generator)
        return InverseCdf(draw_uniform(generator))

    def _appended(self, token_id: int) -> tuple[list[int], str]:
        """The generated ids with the pick appended, and their decoded text."""
        generated = [*self.generated_ids, token_id]
        return generated, self.lm.tokenizer.decode(generated, skip_special_tokens=True)

    def recheck_terminations(self) -> None:
        """Every kept step's conditions re-checked under the current stop settings. A replay steps
        with EOS ignored and the cap raised (a trace may go on past either), then ends with this,
        so its records say what the trace's own settings say, as the original's did."""
        generated: list[int] = []
        for index, record in enumerate(self._steps):
            generated.append(record.token_id)
            text = self.lm.tokenizer.decode(generated, skip_special_tokens=True)
            termination = self._termination(list(generated), text, record.termination.eos_prob)
            self._steps[index] = replace(record, termination=termination)

    def _record(self, sampled: _Sampled, raw_logits: torch.Tensor, before: _Checkpoint, forward_tokens: int,
                forward_ms: float, termination: Termination, text: str) -> StepRecord:
        """Build the step's record from what the stages returned and keep it with its logits."""
        decision, pick = sampled.decision, sampled.decision.token_id
        index = len(self._steps) + 1
        record = StepRecord(
            index=index, position=len(self.prompt_ids) + index - 1, token=self.lm.texts.piece(pick),
            logit=float(raw_logits[pick]), prob=float(sampled.raw_probs[pick]),
            rank=sampled.raw_rank, final_prob=decision.final_prob,
            decision=decision, distribution=sampled.distribution, kv=self.kv, forward_tokens=forward_tokens,
            termination=termination,
            timing=Timing(forward_ms, sampled.sampling_ms, (time.perf_counter() - before.started) * 1e3),
        )
        self._steps.append(record)
        previous = self._kept[-1].rng_state if self._kept else None
        self._kept.append(_StepTensors(raw_logits=raw_logits, rng_state=_RngState.of(before.rng_state, previous)))
        self._forget_old_logits()
        self._keep_capture(len(self._steps) - 1)
        self._text_cache = (len(self._steps), text)
        return record

    def _rewind_cache(self, steps_to_keep: int) -> None:
        """Crop the cache for a rewind. Back to the prompt, the prefill's logits are kept, so
        the prompt is not read again; otherwise the last kept token is read again on the
        next step, exactly as before (its keys and values enter the cache when it is read)."""
        if steps_to_keep == 0:
            crop_cache(self._cache, len(self.prompt_ids))
            self._pending = self._kept_pass(0)
        else:
            crop_cache(self._cache, len(self.prompt_ids) + steps_to_keep - 1)
            self._pending = None

    def _kept_pass(self, position: int) -> _PendingLogits:
        """Step `position + 1`'s logits with the size and time of the pass that made them."""
        record = self._steps[position]
        return _PendingLogits(self._logits_at(position), record.forward_tokens, record.timing.forward_ms)

    def _retake_latest(self, force_token_id: int | None) -> StepRecord:
        """Take the latest step again from its kept logits and random state: the cache is not
        touched (the latest pick never entered it). On failure the latest step stays."""
        latest, kept, generator_state = self._steps[-1], self._kept[-1], self._generator.get_state()
        pending, retaken = self._pending, self._kept_pass(len(self._steps) - 1)
        del self._steps[-1]
        del self._kept[-1]
        self._generator.set_state(kept.rng_state.tensor())
        self._pending = retaken
        try:
            return self.step(force_token_id=force_token_id)
        except BaseException:
            self._steps.append(latest)
            self._kept.append(kept)
            self._generator.set_state(generator_state)
            self._pending = pending
            raise

    def _step_position(self, index: int | None) -> int:
        if not self._steps:
            raise SettingsError("step", index, "a step that has happened (take a step first)")
        if index is None:
            return len(self._steps) - 1
        if not is_whole(index) or not 1 <= index <= len(self._steps):
            raise SettingsError("step", index, f"a step from 1 to {len(self._steps)}")
        return index - 1


