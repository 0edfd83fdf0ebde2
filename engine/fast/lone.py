"""A lone visitor's decode step with transformers' own digits, in much less time.

Why: a decode step at batch 1 reads every weight once, so memory bandwidth bounds it, and the
KV cache & speed page teaches exactly that. Transformers' eager pass does not get there on a
CPU: its 1-row products (MKL's sgemv) read the model's small matrices well below memory speed,
and some 700 small torch calls a step each pay Python's overhead (`python -m bench.lone_bench`;
figures in docs/benchmarks.md, the path in docs/fast-paths.md).

This pass makes the same torch operations in the same order on the same shapes (the scripted
Llama decode pass, engine/fast/scripted_llama.py, with one row) as one TorchScript call, and
multiplies through the exact rows kernel's single-row path, which sums every output in the order
this CPU's 1-row product does (the orders: engine/fast/exact_rows_kernel.cpp's header) while
reading the weights at close to memory speed. So the logits and the cache's entries are the
eager pass's, bit for bit.

Nothing is assumed. The pass is used for a model at a thread count only after a probe has run
it beside the eager pass (several prompt lengths and positions) and found the logits and every
cache entry `torch.equal`; and only where every linear layer goes through the kernel, itself
probed per weight shape. Anywhere else (a model that is not a plain Llama decoder, another CPU
whose 1-row product sums in another order, no compiler, a GPU, `TBT_LONE_PASS=eager`) the eager
pass runs. The registry of proofs (engine/fast/proofs.py) keeps the decision and logs it, once
per model and thread count, and `lone_decision` tells the KV cache & speed page.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from engine.fast import exact_rows_kernel, scripted_llama
from engine.fast.proofs import Verdict, proven, refused, settle
from engine.kvcache import same_entries
from engine.loading import LoadedModel

LONE_PASS_ENV = "TBT_LONE_PASS"  # "eager": every lone step through transformers' pass (comparisons, a suspect CPU)
# the probe: each prompt read by the eager pass, then tokens decoded one at a time by both passes
PROBE_PROMPTS = ((1, 2, 3), tuple(range(10, 47)), (7,))
PROBE_STEPS = (5, 11, 3, 42, 9)

# the verify pass: several tokens of one sequence in one pass, each row with its decode step's digits
VERIFY_MAX_ROWS = 16  # a round's k + 1 (k <= 8) and a few unseen tokens; beyond, transformers' pass reads them
VERIFY_PROBE = (((1, 2, 3), (5, 11)), ((7,), (3, 42, 9, 5)), (tuple(range(10, 47)), (4, 8, 15, 16, 23, 42, 6, 1, 2)))

EagerStep = Callable[[LoadedModel, list[int], DynamicCache], torch.Tensor]  # logits [1, vocab]; the cache grows


@dataclass(frozen=True)
class LoneDecision:
    """Which pass a lone decode step of one model takes at one thread count, and why."""

    fast: bool
    threads: int
    reason: str  # a sentence for the log and the page

    @property
    def path(self) -> str:
        return "the scripted pass with the single-row kernel" if self.fast else "transformers' eager pass"


@dataclass(frozen=True)
class LonePass:
    """The compiled decode pass and how it multiplies one row: every weight through the kernel."""

    run: Callable
    weights: scripted_llama.LlamaWeights
    layer_hows: list[int]
    head_hows: list[int]

    def step(self, token_id: int, cache: DynamicCache) -> torch.Tensor:
        """Next-token logits `[1, vocab]` after `token_id`; the cache grows by one position."""
        return scripted_llama.run_decode(self.run, self.weights, self.layer_hows, self.head_hows,
                                         int(self.weights.head.shape[0]), [token_id], [cache])

    def step_in_parts(self, token_id: int, cache: DynamicCache, parts: scripted_llama.LayerParts) -> PartsSeen:
        """`step`, made layer by layer and half by half (`parts`: the same operations as `run`,
        so the same digits), keeping what a look inside the pass shows: each layer's output at
        the token, its query and the keys it read, and when each part began and ended. The
        cache grows only once the whole pass is made."""
        w, per, hows = self.weights, scripted_llama.LAYER_WEIGHTS, self.layer_hows
        clock, marks = time.perf_counter, []
        hidden = w.embed(torch.tensor([[token_id]], device=w.head.device))  # [1, 1, hidden]
        cos, sin = w.rotary(hidden, torch.tensor([[cache.get_seq_length()]], device=w.head.device))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        states, queries, grown = [hidden[0, -1].float().clone()], [], []
        room_keys, room_values, block = scripted_llama.room_to_grow(cache)
        marks.append(("layer", 0, clock()))
        with torch.jit.optimized_execution(False):  # as run_decode: the ops as written
            for layer in range(len(cache.layers)):
                lw, how = list(w.layers[layer * per:(layer + 1) * per]), hows[layer * per:(layer + 1) * per]
                marks.append(("attention_start", layer + 1, clock()))
                hidden, query, keys, values = parts.attention(hidden, cos, sin, lw, how, room_keys[layer],
                                                              room_values[layer], w.eps, w.head_dim, w.scale, w.gqa)
                marks += [("attention_end", layer + 1, clock()), ("mlp_start", layer + 1, clock())]
                hidden = parts.mlp(hidden, lw, how, w.eps)
                marks.append(("mlp_end", layer + 1, clock()))
                states.append(hidden[0, -1].float().clone())
                queries.append(query)
                grown.append((keys, values))
                marks.append(("layer_end", layer + 1, clock()))
            logits = parts.head(hidden, w.norm, w.eps, w.head, self.head_hows, int(w.head.shape[0]))[0, -1]
            marks.append(("head_end", -1, clock()))
        scripted_llama.keep_grown(cache, block, [keys for keys, _ in grown], [values for _, values in grown])
        return PartsSeen(logits, states, queries, grown, marks)


@dataclass(frozen=True)
class VerifyPass:
    """The compiled verify pass: n tokens in one pass over the weights (every weight through the
    kernel's multi-row path), each row with the digits of the decode step that would read it."""

    run: Callable
    weights: scripted_llama.LlamaWeights
    layer_hows: list[int]
    head_hows: list[int]

    def read(self, token_ids: Sequence[int], cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits `[n, vocab]` and the normed last state `[n, hidden]`; the cache grows by n."""
        return scripted_llama.run_verify(self.run, self.weights, self.layer_hows, self.head_hows,
                                         int(self.weights.head.shape[0]), token_ids, cache)


@dataclass(frozen=True)
class PartsSeen:
    """What a decode step made in parts showed of itself (engine/inside.py reads it)."""

    logits: torch.Tensor  # [vocab], the step's own
    hidden: list[torch.Tensor]  # [hidden] float32 at the token: the decoder's input, then each layer's output
    queries: list[torch.Tensor]  # per layer: the rotated query [1, heads, 1, head_dim]
    read: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: every key and value the query met
    marks: list[tuple[str, int, float]]  # (part, layer, perf_counter), as engine/inside.py's hooks mark them


LONE_PATH = "lone decode step"  # the paths' names in engine/fast/proofs.py's registry
VERIFY_PATH = "verify pass"


def lone_step(lm: LoadedModel, token_ids: Sequence[int], cache: DynamicCache | None, eager: EagerStep
              ) -> torch.Tensor | None:
    """The fast pass's logits `[1, vocab]` for one token read after a filled plain cache, or
    None where it does not apply or was not proven here (the caller runs `eager`)."""
    if len(token_ids) != 1 or not plain_filled(cache, lm):
        return None
    fast = _decided(lm, eager)[1]
    return fast.step(int(token_ids[0]), cache) if fast is not None else None


def lone_decision(lm: LoadedModel, eager: EagerStep) -> LoneDecision:
    """Which pass a lone decode step takes at this thread's count (probed on first call)."""
    return _decided(lm, eager)[0]


def lone_pass(lm: LoadedModel, eager: EagerStep) -> LonePass | None:
    """The proven fast pass at this thread's count, or None where the eager pass runs."""
    return _decided(lm, eager)[1]


def plain_filled(cache: DynamicCache | None, lm: LoadedModel) -> bool:
    """Whether `cache` is a plain DynamicCache holding positions in every one of the model's
    layers: the scripted pass grows each layer as DynamicLayer.update does."""
    return type(cache) is DynamicCache and scripted_llama.grows_layer_by_layer(cache, lm.model.config.num_hidden_layers)


def _decided(lm: LoadedModel, eager: EagerStep) -> tuple[LoneDecision, LonePass | None]:
    return _settled(LONE_PATH, lm, lambda: _decide(lm, eager))


def _settled(path: str, lm: LoadedModel, decide: Callable[[], Verdict]) -> tuple[LoneDecision, object]:
    """`decide()` once per model and thread count, kept in the registry of proofs (which logs it
    once); a decision that raised is the eager pass's, with the reason."""
    def guarded() -> Verdict:
        try:
            return decide()
        except Exception as error:  # whatever went wrong, transformers' pass is still right
            return refused(f"its probe failed ({type(error).__name__})", warn=True)

    proof, fast = settle(path, guarded, owner=lm.model, name=lm.name)
    return LoneDecision(proof.proven, proof.threads, proof.why), fast


@torch.inference_mode()
def _decide(lm: LoadedModel, eager: EagerStep) -> Verdict:
    if os.environ.get(LONE_PASS_ENV, "").strip().lower() == "eager":
        return refused(f"{LONE_PASS_ENV}=eager")
    if lm.device.type != "cpu":
        return refused(f"the model runs on {lm.device.type}, where the kernel is not proven")
    weights = scripted_llama.llama_weights(lm.model)
    if weights is None:
        return refused("the model is not a plain Llama decoder")
    run = scripted_llama.compiled_pass()
    if run is None:
        return refused("TorchScript could not compile the pass")
    products = [w for w in weights.layers if w.dim() == 2] + [weights.head]
    if not all(exact_rows_kernel.kernel_agrees(w, one_row=True) for w in products):
        return refused("the single-row kernel does not sum as this CPU's 1-row product for every weight")
    layer_hows = [scripted_llama.LONE_ROWS if w.dim() == 2 else scripted_llama.ONE_PRODUCT for w in weights.layers]
    fast = LonePass(run, weights, layer_hows, [scripted_llama.LONE_ROWS])
    if not _probe_agrees(lm, fast, eager):
        return refused("its probe pass differed from the eager pass in logits or cache entries")
    return proven("probed equal to transformers' pass, logits and cache, torch.equal", fast)


def _probe_agrees(lm: LoadedModel, fast: LonePass, eager: EagerStep) -> bool:
    """Each probe prompt read by the eager pass into two caches, then the probe's tokens decoded
    one at a time, one cache by each pass: every step's logits and every entry equal."""
    vocab = lm.vocab_size
    for prompt in PROBE_PROMPTS:
        ours, theirs = DynamicCache(config=lm.model.config), DynamicCache(config=lm.model.config)
        eager(lm, [t % vocab for t in prompt], ours)
        eager(lm, [t % vocab for t in prompt], theirs)
        for token in (t % vocab for t in PROBE_STEPS):
            if not torch.equal(fast.step(token, ours), eager(lm, [token], theirs)):
                return False
        if not same_entries(ours, theirs):
            return False
    return True


def verify_rows(lm: LoadedModel, token_ids: Sequence[int], cache: DynamicCache | None, eager: EagerStep
                ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The verify pass's logits `[n, vocab]` and normed last states `[n, hidden]` for 2 to
    VERIFY_MAX_ROWS tokens read after a filled plain cache, each row bit for bit the decode step
    that would read it; or None where it does not apply or was not proven here (the caller runs
    transformers' multi-token pass)."""
    if not 2 <= len(token_ids) <= VERIFY_MAX_ROWS or not plain_filled(cache, lm):
        return None
    fast = _verify_decided(lm, eager)[1]
    return fast.read([int(t) for t in token_ids], cache) if fast is not None else None


def verify_decision(lm: LoadedModel, eager: EagerStep) -> LoneDecision:
    """Which pass several tokens of one sequence take at this thread's count (probed on first call)."""
    return _verify_decided(lm, eager)[0]


def _verify_decided(lm: LoadedModel, eager: EagerStep) -> tuple[LoneDecision, VerifyPass | None]:
    return _settled(VERIFY_PATH, lm, lambda: _decide_verify(lm, eager))


@torch.inference_mode()
def _decide_verify(lm: LoadedModel, eager: EagerStep) -> Verdict:
    lone = _decided(lm, eager)
    if lone[1] is None:
        return refused(f"the lone pass is not in use ({lone[0].reason})")
    run = scripted_llama.compiled_verify()
    if run is None:
        return refused("TorchScript could not compile the pass")
    weights = lone[1].weights
    products = [w for w in weights.layers if w.dim() == 2] + [weights.head]
    if not all(exact_rows_kernel.kernel_agrees(w) for w in products):
        return refused("the kernel's multi-row path does not sum as this CPU's 1-row product for every weight")
    sequence = [scripted_llama.SEQUENCE_ROWS if how == scripted_llama.LONE_ROWS else how for how in lone[1].layer_hows]
    fast = VerifyPass(run, weights, sequence, [scripted_llama.SEQUENCE_ROWS])
    if not _verify_probe_agrees(lm, fast, eager):
        return refused("its probe pass differed from one-token eager steps in logits or cache entries")
    return proven("probed equal to one-token eager steps, logits and cache, torch.equal", fast)


def _verify_probe_agrees(lm: LoadedModel, fast: VerifyPass, eager: EagerStep) -> bool:
    """Each probe prompt read by the eager pass into two caches; then the probe's tokens read in
    one verify pass into one cache and one eager step at a time into the other: every row's
    logits, and every entry, equal."""
    vocab = lm.vocab_size
    for prompt, tokens in VERIFY_PROBE:
        ours, theirs = DynamicCache(config=lm.model.config), DynamicCache(config=lm.model.config)
        eager(lm, [t % vocab for t in prompt], ours)
        eager(lm, [t % vocab for t in prompt], theirs)
        logits, _ = fast.read([t % vocab for t in tokens], ours)
        expected = torch.cat([eager(lm, [t % vocab], theirs) for t in tokens])
        if not torch.equal(logits, expected) or not same_entries(ours, theirs):
            return False
    return True


def weight_products(lm: LoadedModel, fast: bool) -> tuple[Callable[[], object], int]:
    """Every product a lone decode step makes, on its own, and how many calls make them: one row
    through each weight, grouped as the step groups them (through the single-row kernel where
    `fast`, else each linear layer as transformers calls it). What the KV cache & speed page
    times to measure the read bandwidth the way the step reads."""
    weights = scripted_llama.llama_weights(lm.model) if fast else None
    if weights is None:
        linears = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
        rows = {m.in_features: torch.ones((1, 1, m.in_features), dtype=lm.dtype, device=lm.device) for m in linears}
        return (lambda: [m(rows[m.in_features]) for m in linears]), len(linears)
    per = scripted_llama.LAYER_WEIGHTS
    calls = [[weights.layers[start + i] for i in group]
             for start in range(0, len(weights.layers), per) for group in scripted_llama.LAYER_PRODUCTS]
    calls.append([weights.head])
    rows = {w.shape[1]: torch.ones((1, w.shape[1])) for call in calls for w in call}  # one row per input width

    def products() -> None:
        for call in calls:
            exact_rows_kernel.lone_rows_linears(rows[call[0].shape[1]], call)

    return products, len(calls)
