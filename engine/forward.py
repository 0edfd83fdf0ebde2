"""The model's forward pass, as transformers runs it: the one place a visitor's pass runs.

Generation, the speed measurements and speculative decoding call this module: feed token ids,
read the logits at the last position (`forward_all`: at the last few positions, for
speculative decoding's verify pass, which needs one distribution per drafted token), and let
the KV cache grow by the tokens fed. `crop_cache` undoes that growth (Back, speculative
decoding's rejected tokens, a timed step repeated on the same context, a pass that failed
part-way).

A visitor alone always gets transformers' numbers. Its decode steps (one token read after a
filled cache) run as one compiled call through a kernel that reads the weights at memory speed
(engine/fast/lone.py), once a probe on this machine has shown that pass gives this one's
logits and cache entries bit for bit; everything else, and every step where the probe did not
agree, runs transformers' own pass (`eager_step`). Speculative decoding's verify pass (a few
tokens read after a filled cache, `forward_all`) goes the same way where its own probe agreed:
one pass over the weights whose every row has the digits of the decode step that would read
it, so the tokens a round keeps are plain decoding's to the last bit. Several visitors' decode
steps packed into one pass (continuous batching) live with the server that needs them:
engine/serving/packed.py.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from engine.fast import LoneDecision, lone_decision, lone_step, verify_decision, verify_rows
from engine.loading import LoadedModel


def new_cache(lm: LoadedModel) -> DynamicCache:
    """An empty KV cache for `lm`: one layer of keys and values per model layer, filled as
    forward passes read tokens."""
    return DynamicCache(config=lm.model.config)


def cache_length(cache: DynamicCache | None) -> int:
    """Positions the cache holds (0 for no cache)."""
    return cache.get_seq_length() if cache is not None else 0


def plain_head(lm: LoadedModel) -> torch.nn.Linear | None:
    """The language-model head when the logits are exactly that linear map of the decoder's
    output (no soft-capping or scaling after it, as some models have); else None."""
    head = lm.model.get_output_embeddings()
    config = lm.model.config.get_text_config()
    scaled = any(getattr(config, name, None) not in (None, 1, 1.0)
                 for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"))
    return head if type(head) is torch.nn.Linear and not scaled else None


def _head_rows(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """The head on a few positions `[keep, hidden] -> [keep, vocab]`, as W h^T: on the CPU, MKL
    multiplies a handful of rows by the 49,152 x 576 head several times slower in F.linear's
    layout (h W^T) than as W h^T (`python -m bench.speculative_bench`; figures in docs/benchmarks.md)."""
    logits = (head.weight @ hidden.T).T  # [keep, vocab]
    return logits if head.bias is None else logits + head.bias


@torch.inference_mode()
def _logits(lm: LoadedModel, input_ids: torch.Tensor, cache: DynamicCache | None, keep: int) -> torch.Tensor:
    """The pass itself: logits `[batch, keep, vocab]` at the last `keep` positions fed, float32
    on the CPU. The language-model head runs on those positions only: the model's own call for
    one position (every decode step), W h^T for several positions of one sequence."""
    if keep == 1 and input_ids.shape == (1, 1):
        fast = lone_step(lm, input_ids[0].tolist(), cache, eager_step)
        if fast is not None:
            return fast.unsqueeze(0)  # [1, 1, vocab], float32 on the CPU
    return _eager_logits(lm, input_ids, cache, keep)


def _eager_logits(lm: LoadedModel, input_ids: torch.Tensor, cache: DynamicCache | None, keep: int) -> torch.Tensor:
    device = lm.device
    mask = torch.ones((input_ids.shape[0], cache_length(cache) + input_ids.shape[1]), dtype=torch.long,
                      device=device)
    options = dict(input_ids=input_ids.to(device), attention_mask=mask, past_key_values=cache,
                   use_cache=cache is not None)
    head = plain_head(lm) if keep > 1 and input_ids.shape[0] == 1 else None
    if head is None:
        out = lm.model(**options, logits_to_keep=keep).logits[:, -keep:]
    else:
        hidden = lm.model.get_decoder()(**options).last_hidden_state  # [1, new, hidden], after the final norm
        out = _head_rows(head, hidden[0, -keep:]).unsqueeze(0)
    return on_cpu(lm, out)


def forward(lm: LoadedModel, input_ids: torch.Tensor, cache: DynamicCache | None) -> torch.Tensor:
    """Logits at the last position `[batch, vocab]`, float32 on the CPU, for `input_ids`
    `[batch, new]` read after the `cache`'s positions (every row the same length). With a
    cache, it grows by `new` positions; without one, the pass reads only `input_ids`."""
    return _logits(lm, input_ids, cache, keep=1)[:, -1]


@torch.inference_mode()
def eager_step(lm: LoadedModel, token_ids: list[int], cache: DynamicCache) -> torch.Tensor:
    """Transformers' own pass, whatever the fast lone pass would do: logits `[1, vocab]` at the
    last position of `token_ids`, the cache grown by them (the lone pass's probe compares with it)."""
    return _eager_logits(lm, torch.tensor([token_ids]), cache, keep=1)[:, -1]


def lone_pass_decision(lm: LoadedModel) -> LoneDecision:
    """Which pass a lone decode step of `lm` takes at this thread's count, and why (probed once)."""
    return lone_decision(lm, eager_step)


def verify_pass_decision(lm: LoadedModel) -> LoneDecision:
    """Which pass several tokens of one sequence after a filled cache take (speculative decoding's
    verify pass) at this thread's count, and why (probed once)."""
    return verify_decision(lm, eager_step)


def forward_one(lm: LoadedModel, token_ids: list[int], cache: DynamicCache | None) -> torch.Tensor:
    """One sequence's next-token logits `[vocab]` after reading `token_ids`."""
    return forward(lm, torch.tensor([token_ids]), cache)[0]


def forward_all(lm: LoadedModel, token_ids: list[int], cache: DynamicCache | None, keep: int | None = None
                ) -> torch.Tensor:
    """One sequence's logits `[keep, vocab]` at each of the last `keep` positions fed (all of
    them when None): row i is the next-token distribution after the fed tokens up to and
    including token `len(token_ids) - keep + i`. One pass reads the weights once for them all
    (speculative decoding's verify pass)."""
    keep = len(token_ids) if keep is None else keep
    if not 1 <= keep <= len(token_ids):
        raise ValueError(f"keep = {keep} is not allowed: a whole number from 1 to {len(token_ids)} (the tokens fed).")
    if (fast := _verified(lm, token_ids, cache)) is not None:
        return fast[0][-keep:]
    return _logits(lm, torch.tensor([token_ids]), cache, keep=keep)[0]


@torch.inference_mode()
def _verified(lm: LoadedModel, token_ids: list[int], cache: DynamicCache | None
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Several tokens after a filled cache in one pass whose every row has the digits of the
    decode step that would read it (engine/fast/lone.py `verify_rows`), where that is proven here:
    speculative decoding's verify pass then keeps exactly plain decoding's numbers."""
    return verify_rows(lm, token_ids, cache, eager_step)


@torch.inference_mode()
def forward_all_hidden(lm: LoadedModel, token_ids: list[int], cache: DynamicCache | None, keep: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """As `forward_all`, with the decoder's last hidden state (after its final norm) at the same
    positions: `([keep, vocab], [keep, hidden])`, float32 on the CPU. The logits are the very
    ones `forward_all` gives (the same operations on the same tensors): a draft method that
    reads the hidden state (parallel decoding heads, multi-token prediction) changes no number."""
    if not 1 <= keep <= len(token_ids):
        raise ValueError(f"keep = {keep} is not allowed: a whole number from 1 to {len(token_ids)} (the tokens fed).")
    if (fast := _verified(lm, token_ids, cache)) is not None:
        return fast[0][-keep:], fast[1][-keep:]
    input_ids = torch.tensor([token_ids], device=lm.device)
    mask = torch.ones((1, cache_length(cache) + len(token_ids)), dtype=torch.long, device=lm.device)
    options = dict(input_ids=input_ids, attention_mask=mask, past_key_values=cache, use_cache=cache is not None)
    head = plain_head(lm)
    if head is None:  # the model reshapes its logits after the head: its own call, its own last state
        out = lm.model(**options, logits_to_keep=keep, output_hidden_states=True)
        return on_cpu(lm, out.logits[0, -keep:]), on_cpu(lm, out.hidden_states[-1][0, -keep:])
    hidden = lm.model.get_decoder()(**options).last_hidden_state[:, -keep:]  # [1, keep, hidden]
    # one position: the head as the model's own forward calls it; several: W h^T, as _logits does
    logits = head(hidden)[0] if keep == 1 else _head_rows(head, hidden[0])
    return on_cpu(lm, logits), on_cpu(lm, hidden[0])


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep only the cache's first `length` positions (no-op where it holds no more). Layer by
    layer, so a pass that failed after writing only some layers is undone exactly."""
    for layer in cache.layers:
        excess = layer.get_seq_length() - length
        if excess > 0:
            layer.crop(-excess)  # transformers' crop takes a negative count to remove


def cache_prefix(cache: DynamicCache, length: int) -> DynamicCache:
    """A cache that reads as `cache`'s first `length` positions, sharing its tensors (no copy).
    A pass on it grows only the new cache: `cache` is left as it was."""
    prefix = DynamicCache()
    for index, layer in enumerate(cache.layers):
        prefix.update(layer.keys[..., :length, :], layer.values[..., :length, :], index)
    return prefix


def on_cpu(lm: LoadedModel, logits: torch.Tensor) -> torch.Tensor:
    """Logits as float32 on the CPU."""
    logits = logits.to(device="cpu", dtype=torch.float32)
    if lm.device.type == "cuda":  # report real durations: the pass has finished when this returns
        torch.cuda.synchronize(lm.device)
    return logits
