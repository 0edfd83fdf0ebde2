"""The autoregressive loop, one token at a time, with a record of everything at each step.

One step is the four stages of the loop:
  1. forward pass: feed the tokens the KV cache has not seen yet (the whole prompt on the
     first step, then the previous pick) and read the logits at the last position;
  2. sample: softmax over the whole vocabulary, the sampler chain, the pick;
  3. append: the pick joins the context (its keys and values enter the cache on the next
     forward pass, when the model reads it);
  4. check: EOS, stop sequences, max new tokens, context window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from engine.cpu_threads import on_sampler_thread
from engine.errors import GenerationFinished, PromptError, SettingsError
from engine.kvcache import KVSnapshot, read_kv
from engine.loading import LoadedModel
from engine.sampling import DRAW_METHODS, ChainOutput, Decision, decide, draw_uniform, entropy_bits
from engine.settings import SamplerSettings, StopSettings
from engine.stopping import Termination, finish_reason, returned_text, stop_sequence_states
from engine.tokens import TokenPiece

TOP_N = 50  # candidates recorded per step, by raw probability
FINAL_TOP_N = 10  # the final distribution's leaders are always among them


@dataclass(frozen=True)
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
    forward_ms: float
    sampling_ms: float  # sampler chain, draw and the record's instrumentation
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
    forward_tokens: int  # tokens fed to the forward pass: the prompt on step 1, then 1
    termination: Termination
    output_text: str  # the decoded output so far, before any stop-sequence cut
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
class _StepTensors:
    """What a step needs kept to be re-sampled or rewound to; never serialised."""

    raw_logits: torch.Tensor  # [vocab], float32
    rng_state: torch.Tensor  # the generator's state before the step's draw


def describe_distribution(lm: LoadedModel, raw_logits: torch.Tensor, raw_probs: torch.Tensor,
                          chain: ChainOutput, top_n: int = TOP_N) -> Distribution:
    """The leaders by raw probability (plus the final distribution's leaders) and the rest."""
    leader_logits, leader_ids = torch.topk(raw_logits, min(top_n, raw_logits.numel()))
    ids, logits = leader_ids.tolist(), leader_logits.tolist()  # sorted, highest first
    # every token that beats a leader is a leader, so a leader's rank is its first tie's place
    ranks = [logits.index(value) + 1 for value in logits]
    leader_set = set(ids)
    final_values, final_ids = torch.topk(chain.final_probs, min(FINAL_TOP_N, raw_logits.numel()))
    for extra, value in zip(final_ids.tolist(), final_values.tolist(), strict=True):
        if value > 0 and extra not in leader_set:  # zero-probability "leaders" are no leaders
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
        others_prob=max(0.0, 1.0 - float(raw_probs[index].double().sum())),
        others_final_prob=max(0.0, 1.0 - float(chain.final_probs[index].double().sum())),
    )


def build_prompt(lm: LoadedModel, prompt: str, chat: bool, system_prompt: str | None = None
                 ) -> tuple[str, list[int]]:
    """The text the model reads and its token ids; with `chat`, through the chat template
    (whose special tokens stay in the text, visible)."""
    if not prompt or not prompt.strip():
        raise PromptError("The prompt is empty: type some text for the model to continue.")
    tokenizer = lm.tokenizer
    if chat:
        if not lm.has_chat_template:
            raise PromptError(f"{lm.name} has no chat template: turn the chat template off.")
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        text = prompt
        ids = tokenizer(text)["input_ids"]
    if len(ids) >= lm.context_window:
        raise PromptError(f"The prompt is {len(ids)} tokens but the context window is "
                          f"{lm.context_window} tokens, with room needed for at least one new "
                          f"token: shorten the prompt to under {lm.context_window} tokens.")
    return text, list(ids)


class Generation:
    """One visitor's generation: the context, the KV cache, the random generator and the
    record of every step. Not shared between threads; the model is.

    Args:
        lm: the loaded model.
        prompt: the text to continue (or the user message, with `chat`).
        chat: wrap the prompt in the model's chat template.
        sampler: how each token is picked; may be changed between steps.
        stop: termination settings; may be changed between steps.
        seed: seeds this generation's own torch.Generator.
        draw: "cdf" (default) draws one uniform u per step and picks the token whose band
            of the cumulative distribution holds it; "multinomial" draws as
            torch.multinomial does, so a seed reproduces `torch.manual_seed(seed)` followed
            by `generate(do_sample=True)` token for token.
    """

    def __init__(self, lm: LoadedModel, prompt: str, *, chat: bool = False,
                 system_prompt: str | None = None, sampler: SamplerSettings | None = None,
                 stop: StopSettings | None = None, seed: int = 0, draw: str = "cdf") -> None:
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise SettingsError("seed", seed, "a whole number from 0 to 2^63 - 1")
        if draw not in DRAW_METHODS:
            raise SettingsError("draw", draw, f"one of {', '.join(DRAW_METHODS)}")
        self.draw = draw
        self.lm = lm
        self.prompt = prompt
        self.chat = chat
        self.system_prompt = system_prompt
        self.seed = seed
        self.sampler = sampler or SamplerSettings()
        self.stop = stop or StopSettings()
        self.prompt_text, self.prompt_ids = build_prompt(lm, prompt, chat, system_prompt)
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        self._cache = DynamicCache(config=lm.model.config)
        self._steps: list[StepRecord] = []
        self._kept: list[_StepTensors] = []
        self._pending_logits: torch.Tensor | None = None  # logits no step has used yet
        self._text_cache: tuple[int, str] = (-1, "")

    # ---- what the pages read -------------------------------------------------------------

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        return tuple(self._steps)

    @property
    def generated_ids(self) -> list[int]:
        return [s.token_id for s in self._steps]

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.generated_ids

    @property
    def prompt_pieces(self) -> list[TokenPiece]:
        return [self.lm.texts.piece(i) for i in self.prompt_ids]

    @property
    def output_text(self) -> str:
        """All generated tokens decoded, special tokens left out (as servers return them)."""
        count, text = self._text_cache
        if count != len(self._steps):
            text = self.lm.tokenizer.decode(self.generated_ids, skip_special_tokens=True)
            self._text_cache = (len(self._steps), text)
        return text

    @property
    def text(self) -> str:
        """The completion as returned: cut just before the first stop sequence."""
        return returned_text(self.output_text, stop_sequence_states(self.output_text, self.stop.stop_sequences))

    @property
    def termination(self) -> Termination | None:
        """The latest step's conditions re-checked under the current stop settings (which
        may have changed since the step); None before the first step."""
        if not self._steps:
            return None
        return self._termination(self.generated_ids, self.output_text, self._steps[-1].termination.eos_prob)

    @property
    def finish_reason(self) -> str | None:
        """What ends generation under the current stop settings, or None to go on."""
        termination = self.termination
        return termination.finish_reason if termination else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def kv(self) -> KVSnapshot:
        """The cache as it stands now."""
        return read_kv(self._cache, self.lm.geometry, self.lm.dtype)

    def raw_logits(self, index: int | None = None) -> torch.Tensor:
        """A step's raw logits `[vocab]` (a copy); the latest step by default."""
        return self._kept[self._step_position(index)].raw_logits.clone()

    # ---- the loop --------------------------------------------------------------------------

    def step(self, force_token_id: int | None = None) -> StepRecord:
        """Run one step of the loop and return its record.

        `force_token_id` replaces the sampler's pick (a branch); the sampler still runs and
        its own choice is recorded beside the forced one.
        """
        if self.finished:
            raise GenerationFinished(f"Generation has finished ({self.finish_reason}); "
                                     "go Back, change the stop settings, or Reset.")
        if force_token_id is not None and not 0 <= force_token_id < self.lm.vocab_size:
            raise SettingsError("force_token_id", force_token_id, f"a token id from 0 to {self.lm.vocab_size - 1}")
        started = time.perf_counter()
        rng_state = self._generator.get_state()
        raw_logits, forward_tokens, forward_ms = self._next_logits()  # [vocab]

        sampling_started = time.perf_counter()
        context = torch.tensor(self.context_ids)
        decision, raw_probs, distribution = self._sample(raw_logits, context, self.sampler, self._generator,
                                                         force_token_id)
        pick = decision.token_id
        eos_prob = float(raw_probs[list(self.lm.eos_ids)].double().sum()) if self.lm.eos_ids else 0.0

        generated = [*self.generated_ids, pick]
        text = self.lm.tokenizer.decode(generated, skip_special_tokens=True)
        termination = self._termination(generated, text, eos_prob)
        kv = self.kv
        index = len(generated)
        now = time.perf_counter()
        record = StepRecord(
            index=index, position=len(self.prompt_ids) + index - 1, token=self.lm.texts.piece(pick),
            logit=float(raw_logits[pick]), prob=float(raw_probs[pick]),
            rank=int((raw_logits > raw_logits[pick]).sum()) + 1, final_prob=decision.final_prob,
            decision=decision, distribution=distribution, kv=kv, forward_tokens=forward_tokens,
            termination=termination, output_text=text,
            timing=Timing(forward_ms, (now - sampling_started) * 1e3, (now - started) * 1e3),
        )
        self._steps.append(record)
        self._kept.append(_StepTensors(raw_logits=raw_logits, rng_state=rng_state))
        self._text_cache = (len(self._steps), text)
        return record

    def run(self, max_steps: int | None = None) -> Iterator[StepRecord]:
        """Step until a termination condition fires (or `max_steps`), yielding each record."""
        taken = 0
        while not self.finished and (max_steps is None or taken < max_steps):
            yield self.step()
            taken += 1

    def resample(self, sampler: SamplerSettings, index: int | None = None) -> Resampled:
        """Re-run only the sampler chain on a step's kept logits, with other settings.

        Uses the same random number the step drew (or would have drawn), so the result is
        exactly what that step would have picked under `sampler`. No forward pass.
        """
        position = self._step_position(index)
        kept = self._kept[position]
        context = torch.tensor(self.prompt_ids + self.generated_ids[:position])
        generator = torch.Generator(device="cpu")
        generator.set_state(kept.rng_state)
        decision, _, distribution = self._sample(kept.raw_logits, context, sampler, generator)
        return Resampled(decision, distribution)

    def branch(self, token_id: int) -> StepRecord:
        """Replace the latest step's pick with `token_id`: rewind one step and force it."""
        self.rewind(len(self._steps) - 1)
        return self.step(force_token_id=token_id)

    def repick(self) -> StepRecord:
        """Take the latest step again under the current sampler settings."""
        self.rewind(len(self._steps) - 1)
        return self.step()

    def rewind(self, steps_to_keep: int) -> None:
        """Go back to just after step `steps_to_keep` (0 = only the prompt).

        The KV cache is cropped, not recomputed; the random generator returns to its state
        at that point, so stepping again repeats what happened unless settings change.
        """
        if not 0 <= steps_to_keep <= len(self._steps):
            raise SettingsError("steps_to_keep", steps_to_keep, f"a whole number from 0 to {len(self._steps)}")
        if steps_to_keep == len(self._steps):
            return
        following = self._kept[steps_to_keep]
        self._generator.set_state(following.rng_state)
        if steps_to_keep == 0:
            # the prompt's logits are kept, so the prompt is not read again
            self._crop_cache(len(self.prompt_ids))
            self._pending_logits = following.raw_logits
        else:
            # the last kept token is read again on the next step, exactly as before
            self._crop_cache(len(self.prompt_ids) + steps_to_keep - 1)
            self._pending_logits = None
        del self._steps[steps_to_keep:]
        del self._kept[steps_to_keep:]

    # ---- inside a step ---------------------------------------------------------------------

    @on_sampler_thread
    def _sample(self, raw_logits: torch.Tensor, context: torch.Tensor, sampler: SamplerSettings,
                generator: torch.Generator, force_token_id: int | None = None
                ) -> tuple[Decision, torch.Tensor, Distribution]:
        """The decision, the raw softmax and the distribution summary, all on the sampler's thread."""
        decision, chain = self._decide(raw_logits, context, sampler, generator, force_token_id)
        raw_probs = raw_logits.softmax(dim=-1)
        return decision, raw_probs, describe_distribution(self.lm, raw_logits, raw_probs, chain)

    def _decide(self, logits: torch.Tensor, context: torch.Tensor, sampler: SamplerSettings,
                generator: torch.Generator, force_token_id: int | None = None) -> tuple[Decision, ChainOutput]:
        """The sampler's decision; a sampling step always consumes its draw, forced or not,
        so the random stream stays the same whatever the visitor forces."""
        if sampler.greedy:
            return decide(logits, context, sampler, None, force_token_id)
        if self.draw == "multinomial":
            return decide(logits, context, sampler, None, force_token_id, generator=generator)
        return decide(logits, context, sampler, draw_uniform(generator), force_token_id)

    def _step_position(self, index: int | None) -> int:
        if not self._steps:
            raise SettingsError("step", index, "a step that has happened (take a step first)")
        if index is None:
            return len(self._steps) - 1
        if not 1 <= index <= len(self._steps):
            raise SettingsError("step", index, f"a step from 1 to {len(self._steps)}")
        return index - 1

    def _crop_cache(self, length: int) -> None:
        excess = self._cache.get_seq_length() - length
        if excess > 0:
            self._cache.crop(-excess)

    def _next_logits(self) -> tuple[torch.Tensor, int, float]:
        """Logits for the next position: kept ones after a rewind, else a forward pass over
        the tokens the cache has not seen."""
        if self._pending_logits is not None:
            logits, self._pending_logits = self._pending_logits, None
            return logits, 0, 0.0
        unseen = self.context_ids[self._cache.get_seq_length():]
        started = time.perf_counter()
        logits = self._forward(unseen)
        return logits, len(unseen), (time.perf_counter() - started) * 1e3

    @torch.inference_mode()
    def _forward(self, token_ids: list[int]) -> torch.Tensor:
        device = self.lm.device
        input_ids = torch.tensor([token_ids], device=device)
        attention_mask = torch.ones((1, self._cache.get_seq_length() + len(token_ids)),
                                    dtype=torch.long, device=device)
        out = self.lm.model(input_ids=input_ids, attention_mask=attention_mask,
                            past_key_values=self._cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1].to(device="cpu", dtype=torch.float32)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return logits  # [vocab]

    def _termination(self, generated: list[int], text: str, eos_prob: float) -> Termination:
        """Every condition's state once `generated` (whose decoded text is `text`) is out."""
        stops = stop_sequence_states(text, self.stop.stop_sequences)
        state = dict(eos_picked=bool(generated) and generated[-1] in self.lm.eos_ids,
                     ignore_eos=self.stop.ignore_eos, stops=stops, new_tokens=len(generated),
                     max_new_tokens=self.stop.max_new_tokens,
                     context_tokens=len(self.prompt_ids) + len(generated),
                     context_window=self.lm.context_window)
        return Termination(eos_ids=self.lm.eos_ids, eos_prob=eos_prob, finish_reason=finish_reason(**state), **state)
