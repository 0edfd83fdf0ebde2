"""Self-distillation data: the model's own greedy continuations of the prompts shipped in
training/prompts.txt, and its last hidden state (after the final norm) at every position.

Recipe (one `Recipe` value, recorded with the weights):
  1. every prompt twice: as plain text to continue and as a chat message (the chat template);
     every `held_out_every`-th prompt (both forms) is held out for evaluation;
  2. greedy continuations, `max_new_tokens` at most, cut after an end token, made in batches
     (left-padded, transformers' own `generate`, so the labels are what the model itself writes);
  3. one teacher-forced pass over prompt + continuation (right-padded, so no position moves)
     gives the hidden state h_j that predicted continuation token j.

A `Sequences` row j pairs h_j with token j: a draft trained on it learns what the target would
write next from the state the target already computed. The result is cached under the user's
cache folder, keyed by the recipe, the prompts and the model, so the heads and the MTP module
share one generation.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.loading import LoadedModel, cache_root
from engine.prompt import build_prompt

PROMPTS = Path(__file__).parent / "prompts.txt"
DATA_FORMAT = 1  # bump when the cached layout changes


@dataclass(frozen=True)
class Recipe:
    """How the distillation data is made."""

    max_new_tokens: int = 160
    held_out_every: int = 10  # prompt i is held out when i % held_out_every == held_out_every - 1
    generate_batch: int = 48  # prompts per batched greedy generation
    hidden_batch: int = 8  # sequences per teacher-forced pass
    prompt_limit: int | None = None  # use only the first n prompts (smoke runs)


@dataclass
class Sequences:
    """Continuations: hidden[i] `[T_i, hidden]` row j is the state that predicted tokens[i][j]."""

    hidden: list[torch.Tensor]
    tokens: list[torch.Tensor]  # [T_i] int64
    prompts: list[str]

    @property
    def rows(self) -> int:
        return sum(t.numel() for t in self.tokens)


@dataclass
class Distilled:
    train: Sequences
    held: Sequences
    info: dict  # the recipe, counts and timings, for the manifest and the log


def read_prompts(path: Path = PROMPTS) -> list[str]:
    """Non-empty lines that are not comments."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def split_prompts(prompts: list[str], every: int) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts): every `every`-th prompt is held out."""
    held = [p for i, p in enumerate(prompts) if i % every == every - 1]
    return [p for i, p in enumerate(prompts) if i % every != every - 1], held


def _pad_id(lm: LoadedModel) -> int:
    pad = lm.tokenizer.pad_token_id
    return int(pad) if pad is not None else int(lm.eos_ids[0])


def _cut_after_end(tokens: list[int], eos_ids: set[int]) -> list[int]:
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[:index + 1]
    return tokens


@torch.inference_mode()
def greedy_continuations(lm: LoadedModel, prompts: list[list[int]], max_new_tokens: int, batch: int) -> list[list[int]]:
    """The model's greedy continuation of each prompt (ids), cut after its first end token.
    Prompts of similar length share a batch, so little padding is read."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    pad, eos = _pad_id(lm), set(lm.eos_ids)
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):  # left padding: every prompt ends at the last column
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        generated = lm.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                      do_sample=False, temperature=None, top_p=None, top_k=None,
                                      eos_token_id=list(lm.eos_ids), pad_token_id=pad)
        for row, i in enumerate(chunk):
            out[i] = _cut_after_end(generated[row, width:].tolist(), eos)
    return out


@torch.inference_mode()
def hidden_states(lm: LoadedModel, prompts: list[list[int]], continuations: list[list[int]], batch: int
                  ) -> list[torch.Tensor]:
    """For each prompt + continuation, the last hidden state `[len(continuation), hidden]` at the
    positions that predicted the continuation's tokens (right padding: positions unchanged)."""
    out: list[torch.Tensor] = []
    decoder = lm.model.get_decoder()
    for start in range(0, len(prompts), batch):
        rows = [p + c for p, c in zip(prompts[start:start + batch], continuations[start:start + batch], strict=True)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), _pad_id(lm), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, seq in enumerate(rows):
            ids[row, :len(seq)] = torch.tensor(seq)
            mask[row, :len(seq)] = 1
        last = decoder(input_ids=ids, attention_mask=mask).last_hidden_state  # [batch, width, hidden]
        for row, (p, c) in enumerate(zip(prompts[start:start + batch], continuations[start:start + batch],
                                         strict=True)):
            out.append(last[row, len(p) - 1:len(p) - 1 + len(c)].float().clone())
    return out


def _encode(lm: LoadedModel, prompts: list[str]) -> tuple[list[list[int]], list[str]]:
    """Each prompt as plain text and as a chat message (where the model has a chat template)."""
    ids, names = [], []
    for prompt in prompts:
        for chat in (False, True) if lm.has_chat_template else (False,):
            ids.append(build_prompt(lm, prompt, chat).ids)
            names.append(("chat: " if chat else "text: ") + prompt)
    return ids, names


def _sequences(lm: LoadedModel, prompts: list[str], recipe: Recipe) -> Sequences:
    ids, names = _encode(lm, prompts)
    continuations = greedy_continuations(lm, ids, recipe.max_new_tokens, recipe.generate_batch)
    keep = [i for i, c in enumerate(continuations) if c]
    ids, names, continuations = [ids[i] for i in keep], [names[i] for i in keep], [continuations[i] for i in keep]
    hidden = hidden_states(lm, ids, continuations, recipe.hidden_batch)
    return Sequences(hidden, [torch.tensor(c, dtype=torch.long) for c in continuations], names)


def _cache_key(lm: LoadedModel, prompts: list[str], recipe: Recipe) -> str:
    config = lm.model.config.get_text_config()
    blob = json.dumps({"format": DATA_FORMAT, "recipe": asdict(recipe), "prompts": prompts, "model": lm.name,
                       "hidden": config.hidden_size, "layers": config.num_hidden_layers, "vocab": lm.vocab_size,
                       "torch": torch.__version__.split("+")[0]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def distill(lm: LoadedModel, recipe: Recipe, prompts_path: Path = PROMPTS, cache: Path | None = None,
            log=print) -> Distilled:
    """The training and held-out sequences for `lm`, from the cache when the same recipe has
    already been made (cache None: the user's cache folder; pass a temp folder in tests)."""
    prompts = read_prompts(prompts_path)[:recipe.prompt_limit]
    cache = cache_root() / "distill" if cache is None else cache
    path = cache / f"distill-{_cache_key(lm, prompts, recipe)}.pt"
    if path.is_file():
        stored = torch.load(path, weights_only=False)
        log(f"distillation data from the cache: {path}")
        return Distilled(Sequences(**stored["train"]), Sequences(**stored["held"]), stored["info"])
    train_prompts, held_prompts = split_prompts(prompts, recipe.held_out_every)
    started = time.perf_counter()
    train = _sequences(lm, train_prompts, recipe)
    log(f"training sequences: {len(train.tokens)} ({train.rows:,} tokens) in {time.perf_counter() - started:.0f} s")
    held = _sequences(lm, held_prompts, recipe)
    info = {"recipe": asdict(recipe), "prompts_file": prompts_path.name, "prompts": len(prompts),
            "prompts_sha256": hashlib.sha256(prompts_path.read_bytes()).hexdigest(),
            "train_sequences": len(train.tokens), "train_tokens": train.rows,
            "held_sequences": len(held.tokens), "held_tokens": held.rows,
            "seconds": round(time.perf_counter() - started, 1)}
    log(f"held-out sequences: {len(held.tokens)} ({held.rows:,} tokens); data in {info['seconds']:.0f} s")
    cache.mkdir(parents=True, exist_ok=True)
    torch.save({"train": asdict(train), "held": asdict(held), "info": info}, path)
    return Distilled(train, held, info)


def draft_vocabulary(lm: LoadedModel, train: Sequences, size: int) -> torch.Tensor:
    """The draft's reduced vocabulary `[size]`, most frequent first: the end tokens, then the
    tokens of the training continuations by count, then the lowest ids not yet taken (a BPE
    vocabulary numbers its earliest, most common merges first)."""
    size = min(size, lm.vocab_size)
    counts = Counter(int(t) for seq in train.tokens for t in seq)
    chosen = list(dict.fromkeys([*lm.eos_ids, *(t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))]))
    chosen = chosen[:size]
    taken = set(chosen)
    chosen += [t for t in range(lm.vocab_size) if t not in taken][:size - len(chosen)]
    return torch.tensor(chosen, dtype=torch.long)
