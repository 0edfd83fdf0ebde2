"""Trained draft methods that read the target's own last hidden state: parallel decoding heads
(Medusa-style) and a multi-token-prediction module (DeepSeek-V3-style MTP), both trained here
for the bundled model by `python -m training.heads` / `python -m training.mtp` and shipped in
`assets/` with a checksum.

Both learn from what the verify pass already computed: the loop hands them the target's
hidden state (after its final norm) at every verified position (`RoundOutcome`, via
`observe`), and the state that predicted the last emitted token is where the next guesses
start. Neither runs the target's layers again.

- `MedusaHeads`: K small residual blocks h + SiLU(W_i h), each read through the model's own
  frozen LM head; head i guesses the token i positions after the last emitted one, all K from
  the same hidden state, at once (they never see each other's guesses).
- `MtpDraft`: one small block over [RMSNorm(h); RMSNorm(embedding of the last token)] that
  predicts the target's next hidden state; through the LM head that state gives the next guess,
  and fed back with the guess's embedding it gives the one after (sequential, like a tiny
  draft model with no KV cache).

The draft reads only a reduced vocabulary: the LM head's rows for the tokens most frequent in
the distillation data (as EAGLE-3 does), so a guess costs a fraction of the 49,152-row head.
A guess outside that vocabulary is impossible (q = 0 there); exactness is the verify rule's
job and does not depend on it.

Both guess again only while sure: after a guess the draft gave less than `GO_ON` of its own
softmax, the round's guesses end there, however large k is (k is the most a round may guess).
A guess the draft is unsure of is rarely kept (`bench.heads_bench` prints the table), and each
further one costs a draft step and a verify row for nothing; the first guess is always made,
since a verify row costs far less than the token it may win. Which guesses are made never
changes the output: only the verify rule decides what is kept.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.errors import ModelLoadError, SettingsError
from engine.fast import kernel_available, sequence_rows_linear
from engine.loading import LoadedModel
from engine.sampling import top_token
from engine.settings import SamplerSettings
from engine.speculative.drafting import NO_DRAFT, Draft, DraftPicture, Leader, RoundOutcome, _draft_pick, leaders_of

ASSETS = Path(__file__).resolve().parent.parent.parent / "assets"
MANIFEST = ASSETS / "draft_heads.json"  # checksums, configs, seeds, data recipe and figures of both
MANIFEST_FORMAT = 1
MEDUSA = "medusa-heads"
MTP = "mtp"
# a trained draft guesses again only while it gave its last guess at least this much of its
# softmax: on the training's held-out prompts (greedy, k up to 4, the shipped MTP module) the
# speed-up a cost model of the measured round gave was flat from 0.5 to 0.7 and fell off below
# 0.4, where unsure guesses each cost a verify row
GO_ON = 0.5


# ---- the networks ----------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """x / rms(x) * weight, as Llama's norm (computed in float32)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MedusaNet(nn.Module):
    """K residual blocks on one hidden state: out_i = h + SiLU(W_i h + b_i), `[..., K, hidden]`.
    W_i starts at zero, so every head starts as the model's own head (then learns its offset)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.proj = nn.Linear(hidden, heads * hidden)  # the K heads' W_i stacked: one product for all
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shifted = nn.functional.silu(self.proj(h)).unflatten(-1, (self.heads, h.shape[-1]))  # [..., K, hidden]
        return h.unsqueeze(-2) + shifted


class MtpNet(nn.Module):
    """One MTP step: (h_t, embedding of token t+1) -> the target's hidden state at t+1, after
    its final norm (so the LM head reads it as the target's own, and it can be fed back).

    [RMSNorm(h); RMSNorm(e)] -> linear 2H -> H -> x + SwiGLU(RMSNorm(x)) per block -> final RMSNorm.
    The blocks are MLPs, not attention: the draft sees only the one state the verify pass
    handed over, not the whole context, so there is nothing to attend to.
    """

    def __init__(self, hidden: int, intermediate: int, blocks: int, eps: float) -> None:
        super().__init__()
        self.norm_h = RMSNorm(hidden, eps)
        self.norm_e = RMSNorm(hidden, eps)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.norms = nn.ModuleList(RMSNorm(hidden, eps) for _ in range(blocks))
        self.gate_up = nn.ModuleList(nn.Linear(hidden, 2 * intermediate, bias=False) for _ in range(blocks))
        self.down = nn.ModuleList(nn.Linear(intermediate, hidden, bias=False) for _ in range(blocks))
        self.final_norm = RMSNorm(hidden, eps)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        x = self.proj(torch.cat([self.norm_h(h), self.norm_e(e)], dim=-1))  # [..., hidden]
        for norm, gate_up, down in zip(self.norms, self.gate_up, self.down, strict=True):
            gate, up = gate_up(norm(x)).chunk(2, dim=-1)
            x = x + down(nn.functional.silu(gate) * up)
        return self.final_norm(x)


# ---- the shipped weights ---------------------------------------------------------------------


@dataclass(frozen=True)
class TrainedDraft:
    """A trained draft network, loaded and checked, with the draft vocabulary it reads."""

    method: str
    net: nn.Module
    vocab_ids: torch.Tensor  # [V] the draft vocabulary, most frequent first (int64)
    entry: dict  # the manifest's entry: file, sha256, config, seed, data recipe, figures


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(manifest: Path = MANIFEST) -> dict:
    """The manifest of the shipped draft weights; ModelLoadError when it is missing or broken."""
    try:
        data = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"The trained draft weights' manifest {manifest} is missing: train them with "
                             "`python -m training.heads` and `python -m training.mtp`, or restore assets/.") from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"The trained draft weights' manifest {manifest} cannot be read: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ModelLoadError(f"{manifest} is not a draft-weights manifest of format {MANIFEST_FORMAT}.")
    return data


def build_net(method: str, config: dict) -> nn.Module:
    """The untrained network a manifest entry's config describes."""
    if method == MEDUSA:
        return MedusaNet(config["hidden_size"], config["heads"])
    if method == MTP:
        return MtpNet(config["hidden_size"], config["intermediate_size"], config["blocks"], config["rms_norm_eps"])
    raise SettingsError("trained draft method", method, f"one of {MEDUSA}, {MTP}")


def load_trained(method: str, lm: LoadedModel, manifest: Path = MANIFEST) -> TrainedDraft:
    """The shipped weights of `method` (MEDUSA or MTP), checked against the manifest's SHA-256
    and against `lm` (hidden size, vocabulary). ModelLoadError names a missing, corrupt or
    foreign file; SettingsError a model the weights were not trained for."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    entry = read_manifest(manifest).get(method)
    if not isinstance(entry, dict):
        raise ModelLoadError(f"{manifest} has no entry for {method!r}: train it with `python -m training."
                             f"{'heads' if method == MEDUSA else 'mtp'}`.")
    path = manifest.parent / entry["file"]
    if not path.is_file():
        raise ModelLoadError(f"The {method} weights {path} are missing: restore assets/ or train them again.")
    if (found := sha256_of(path)) != entry["sha256"]:
        raise ModelLoadError(f"The {method} weights {path} are corrupt: their SHA-256 is {found[:16]}…, the "
                             f"manifest records {entry['sha256'][:16]}…. Restore the file or train it again.")
    config = entry["config"]
    hidden, vocab = int(lm.model.config.get_text_config().hidden_size), lm.vocab_size
    if (config["hidden_size"], config["vocab_size"]) != (hidden, vocab):
        raise SettingsError("model", lm.name, f"the model the {method} weights were trained for "
                            f"({entry['trained_for']}: hidden size {config['hidden_size']}, "
                            f"{config['vocab_size']:,} tokens)")
    try:
        tensors = load_file(str(path))
        net = build_net(method, config)
        net.load_state_dict({name: value.float() for name, value in tensors.items() if name != "vocab_ids"})
        vocab_ids = tensors["vocab_ids"].long()
    except (SafetensorError, KeyError, RuntimeError) as exc:  # checksum right but tensors wrong: a foreign file
        raise ModelLoadError(f"The {method} weights {path} do not fit their manifest's config: {exc}") from exc
    return TrainedDraft(method, net.eval(), vocab_ids, entry)


# ---- drafting --------------------------------------------------------------------------------


class _HiddenStateDraft:
    """What both trained drafts share: the verify pass's last state kept from `observe`, the
    draft vocabulary's LM-head rows, and one pick per guess through the target's sampler chain.

    Args:
        lm: the target model (the weights were trained for it; checked).
        trained: loaded weights (`load_trained`); None loads the shipped ones.
        draft_vocab: LM-head rows the draft reads: the first n of the trained draft vocabulary
            (most frequent first); None for all of it.
        full_head: read the whole LM head instead (every token; to measure what the reduced
            vocabulary buys).
        go_on: guess again only after a guess given at least this draft probability (0 to 1; 0
            always guesses k tokens).
    """

    method = ""
    wants_hidden = True

    def __init__(self, lm: LoadedModel, trained: TrainedDraft | None = None, draft_vocab: int | None = None,
                 full_head: bool = False, go_on: float = GO_ON) -> None:
        if isinstance(go_on, bool) or not isinstance(go_on, (int, float)) or not 0 <= go_on <= 1:
            raise SettingsError("go_on", go_on, "a probability from 0 to 1 (0 always guesses k tokens)")
        self.go_on = float(go_on)
        self.trained = trained if trained is not None else load_trained(self.method, lm)
        head = lm.model.get_output_embeddings().weight.detach()  # [vocab, hidden], tied to the embeddings
        available = self.trained.vocab_ids.numel()
        draft_vocab = available if draft_vocab is None else draft_vocab
        if full_head:
            self.vocab_ids = None
            self.head_rows = head
        else:
            if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= available:
                raise SettingsError("draft_vocab", draft_vocab, f"a whole number from 1 to {available:,} "
                                    "(LM-head rows the draft reads)")
            self.vocab_ids = self.trained.vocab_ids[:draft_vocab]
            self.head_rows = head[self.vocab_ids].contiguous()  # [V, hidden]
        self.vocab = lm.vocab_size
        rows = self.head_rows
        self._kernel_scores = (rows.dtype == torch.float32 and rows.device.type == "cpu" and rows.is_contiguous()
                               and rows.shape[1] % 4 == 0 and rows.shape[1] >= 8
                               and kernel_available())
        self.embeddings = lm.model.get_input_embeddings().weight.detach()  # [vocab, hidden]
        self.eos_ids = frozenset(lm.eos_ids)
        self._context: tuple[int, ...] | None = None  # the context the kept state belongs to
        self._hidden: torch.Tensor | None = None  # [hidden] the state that predicted its last token
        self.picturing = False
        self.last_picture: DraftPicture | None = None

    def observe(self, outcome: RoundOutcome) -> None:
        """Keep the state that predicted the round's last emitted token."""
        self._context = outcome.context_ids
        self._hidden = outcome.hidden[outcome.emitted - 1].float()

    def update(self, context_ids: Sequence[int]) -> None:
        """Forget the kept state when the context is not the one it was observed on (a rewind)."""
        if self._context is not None and tuple(context_ids) != self._context:
            self._context, self._hidden = None, None

    def release(self) -> None:
        self._context, self._hidden = None, None

    def _start(self, context_ids: Sequence[int], k: int) -> torch.Tensor | None:
        """The state to draft from, or None (no guess: first round, or a context not observed)."""
        if k < 1 or self._hidden is None or tuple(context_ids) != self._context:
            return None
        return self._hidden

    def _scores(self, states: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits `[n, V]` of states `[n, hidden]`: through the exact rows kernel
        where it is built (it streams the head's rows at memory speed, and a draft's guesses need
        no particular product's digits), else as W h^T (engine/forward.py's layout, the fast one
        for a few rows on the CPU)."""
        if self._kernel_scores:
            return sequence_rows_linear(states.float().contiguous(), self.head_rows)
        return (self.head_rows @ states.T).T

    def _pick(self, scores: torch.Tensor, context: list[int], sampler: SamplerSettings,
              generator: torch.Generator) -> tuple[int, torch.Tensor | None, float]:
        """One guess from draft-vocabulary logits `[V]`, q `[vocab]` (None when greedy: a
        deterministic guess; tokens outside the draft vocabulary have q = 0), and how sure the
        draft is of it: its own softmax over `scores` there, before the sampler."""
        if sampler.greedy and sampler.repetition_penalty == 1:
            best = top_token(scores)
            sure = float(scores.softmax(dim=-1)[best])
            return (best if self.vocab_ids is None else int(self.vocab_ids[best])), None, sure
        full = scores if self.vocab_ids is None else torch.full((self.vocab,), float("-inf")).index_put_(
            (self.vocab_ids,), scores)  # [vocab]
        token, q = _draft_pick(full, context, sampler, generator)
        return token, (None if sampler.greedy else q), float(full.softmax(dim=-1)[token])

    def _after_guess(self, token: int, sure: float, made: int, k: int) -> tuple[bool, float | None]:
        """Whether the draft ends after its `made`-th guess of at most k (an end token: nothing
        follows it; or a guess it was unsure of), and, where it ends short of k because unsure,
        how sure it was (for the picture)."""
        if token in self.eos_ids:
            return True, None
        if sure < self.go_on:
            return True, (sure if made < k else None)
        return False, None

    def _leaders(self, scores: torch.Tensor) -> tuple[Leader, ...]:
        """The draft's leading tokens for one guess's draft-vocabulary logits `[V]` (picturing only)."""
        return leaders_of(scores, self.vocab_ids) if self.picturing else ()

    def _draft(self, tokens: list[int], rows: list[torch.Tensor | None], context: Sequence[int],
               leaders: list[tuple[Leader, ...]], stopped_unsure: float | None) -> Draft:
        """The round's Draft (and its picture); `stopped_unsure`: the last guess's draft
        probability where it ended the draft before k, else None."""
        if self.picturing:
            self.last_picture = DraftPicture(self.method, tuple(tokens), tuple(leaders[:len(tokens)]), context[-1],
                                             stopped_unsure=stopped_unsure, go_on=self.go_on)
        q = None if rows[0] is None else torch.stack(rows)  # [len, vocab]
        return Draft(tuple(tokens), q)


class MedusaHeads(_HiddenStateDraft):
    """Parallel decoding heads: from the state that predicted the last emitted token, head i
    guesses the token i places after it (i = 1..K), all in one small product. Up to K guesses
    per round (k above K is capped)."""

    method = MEDUSA
    name = MEDUSA
    label = "parallel decoding heads (Medusa-style, trained here)"

    @property
    def heads(self) -> int:
        return self.trained.net.heads

    @torch.inference_mode()
    def get_candidates(self, context_ids: Sequence[int], k: int, sampler: SamplerSettings,
                       generator: torch.Generator) -> Draft:
        self.last_picture = None
        hidden = self._start(context_ids, k)
        if hidden is None:
            return NO_DRAFT
        count = min(k, self.heads)
        states = self.trained.net(hidden)[:count]  # [count, hidden]: every head at once
        scores = self._scores(states)  # [count, V]
        context, tokens, rows, stopped = list(context_ids), [], [], None
        for i in range(count):
            token, q, sure = self._pick(scores[i], context + tokens, sampler, generator)
            tokens.append(token)
            rows.append(q)
            ends, stopped = self._after_guess(token, sure, i + 1, count)
            if ends:
                break
        return self._draft(tokens, rows, context, [self._leaders(scores[i]) for i in range(len(tokens))], stopped)


class MtpDraft(_HiddenStateDraft):
    """Multi-token prediction as a draft: (last state, last token's embedding) -> the next
    state -> a guess, fed back k times."""

    method = MTP
    name = MTP
    label = "multi-token prediction module (DeepSeek-V3-style, trained here)"

    @torch.inference_mode()
    def get_candidates(self, context_ids: Sequence[int], k: int, sampler: SamplerSettings,
                       generator: torch.Generator) -> Draft:
        self.last_picture = None
        state = self._start(context_ids, k)
        if state is None:
            return NO_DRAFT
        context, tokens, rows, leaders, stopped = list(context_ids), [], [], [], None
        token = context[-1]
        for i in range(k):
            state = self.trained.net(state, self.embeddings[token])  # [hidden]: the guessed next state
            scores = self._scores(state.unsqueeze(0))[0]
            token, q, sure = self._pick(scores, context + tokens, sampler, generator)
            tokens.append(token)
            rows.append(q)
            leaders.append(self._leaders(scores))
            ends, stopped = self._after_guess(token, sure, i + 1, k)
            if ends:
                break
        return self._draft(tokens, rows, context, leaders, stopped)
