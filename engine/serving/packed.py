"""Several visitors' passes in one: the decode steps waiting together (`forward_packed`) and
the prompts of new visitors (`forward_prefills`), each row with its lone pass's numbers.

This CPU's matrix kernels are not batch-invariant: a B-row matrix product sums each row in
another order than a 1-row product, so a row's logits from a batch differ from its lone
pass's in the last bits (bench/batch_parity.py measures by how much). So a packed pass comes in
two kinds:
- exact (the default): every linear layer gives each row its own 1-row product's digits. The
  scripted pass, from two rows, through a kernel that sums each row in the order the 1-row
  product does (the orders: engine/fast/exact_rows_kernel.cpp's header) and reads each weight
  once for all rows;
  otherwise, and in the eager twin (engine/serving/packed_twin.py), as 1-row products, all
  rows in one batched call. Each visitor gets its lone pass's logits bit for bit.
- fast: one B-row matrix product per layer from the library.

A Llama-family model runs each pass as one TorchScript call outside the GIL
(engine/fast/scripted_llama.py), used only once a probe pass has shown it gives the eager
twin's digits (logits and cache entries, torch.equal) on this machine; any other model, or
one whose probe differs, runs on the twin. Both the kernel and the scripted passes are made for
this CPU's products and probed on it: a model on a GPU runs every packed pass on the twin
(`scripted_passes_apply`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.fast import (
    LAYER_WEIGHTS,
    LONE_ROWS,
    ONE_PRODUCT,
    ONE_ROW_PRODUCTS,
    ROW_LOOP,
    LlamaWeights,
    Verdict,
    compiled_pass,
    compiled_prefill,
    grows_layer_by_layer,
    kernel_agrees,
    llama_weights,
    proven,
    refused,
    run_decode,
    settle,
)
from engine.forward import cache_length, crop_cache, forward, new_cache, on_cpu
from engine.kvcache import same_entries
from engine.loading import LoadedModel
from engine.serving import packed_twin
from engine.serving.packed_twin import ROWWISE_CHUNK
from engine.serving.prompt_rows import RowKinds, measure_row_kinds, prompt_rows

# rows from which one pass over a weight beats batched 1-row products: already at a few visitors
# the kernel made more tokens a second (`python -m bench.sched_bench --visitors 2,3`; docs/benchmarks.md)
LONE_ROWS_FROM = 2


@torch.inference_mode()
def forward_packed(lm: LoadedModel, token_ids: Sequence[int], caches: Sequence[DynamicCache],
                   exact: bool = True, eager: bool = False) -> torch.Tensor:
    """Next-token logits `[rows, vocab]` for one new token per visitor: `token_ids[i]` read
    after `caches[i]`'s positions, each cache growing by one. Caches may differ in length.
    With `exact`, each row's logits are its lone pass's bit for bit; otherwise within ~1e-4.
    A Llama-family model runs the pass as one call outside the GIL (engine/fast/scripted_llama.py);
    any other model, or any with `eager` (a benchmark's comparison), on its twin. If the pass
    fails, every cache is left as it was and the error is raised."""
    plan = None if eager else scripted_plan(lm, exact)
    layers = None if plan is None else len(plan.weights.layers) // LAYER_WEIGHTS
    if plan is not None and all(grows_layer_by_layer(cache, layers) for cache in caches):
        return _forward_scripted(plan, token_ids, caches)
    return packed_twin.forward_twin(lm, token_ids, caches, exact)


@dataclass
class ScriptedPlan:
    """What a scripted packed pass needs for one model and batching kind: the compiled pass,
    the model's weights laid out for it, and, per row count, how each linear layer multiplies."""

    lm: LoadedModel
    run: Callable
    weights: LlamaWeights
    exact: bool
    hows: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)  # rows -> (layers, head slices)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hows_for(self, rows: int) -> tuple[list[int], list[int]]:
        """Per weight of the layers, and per slice of the head: how to multiply `rows` rows."""
        with self.lock:
            if rows not in self.hows:
                self.hows[rows] = ([self._how(w, rows) for w in self.weights.layers],
                                   [self._how(w, rows) for w in self._head_slices()])
            return self.hows[rows]

    def head_chunk(self) -> int:
        return ROWWISE_CHUNK if self.exact else self.weights.head.shape[0]

    def _head_slices(self) -> list[torch.Tensor]:
        return head_slices(self.weights.head, self.head_chunk())

    def _how(self, weight: torch.Tensor, rows: int) -> int:
        if not self.exact or weight.dim() != 2:  # norms' weights are not multiplied
            return ONE_PRODUCT
        return one_row_products_how(weight, rows)


def exact_rows_kernel_in_use(lm: LoadedModel) -> bool:
    """Whether exact packed passes of `lm` go through the exact rows kernel (engine/fast/exact_rows_kernel.py):
    a scripted pass whose linear layers take it once there are rows enough."""
    plan = scripted_plan(lm, exact=True)
    return plan is not None and LONE_ROWS in plan.hows_for(LONE_ROWS_FROM)[0]


def head_slices(head: torch.Tensor, chunk: int) -> list[torch.Tensor]:
    """The language-model head in slices of `chunk` output features."""
    return [head[start:start + chunk] for start in range(0, head.shape[0], chunk)]


def one_row_products_how(weight: torch.Tensor, rows: int) -> int:
    """How `rows` rows each get their own 1-row product's digits by `weight`: from LONE_ROWS_FROM
    rows, in one pass over the weight where the kernel gives those digits for this shape
    (engine/fast/exact_rows_kernel.py); else in one batched call where the probe says it gives the row-by-row
    loop's digits; else one call a row."""
    if rows >= LONE_ROWS_FROM and kernel_agrees(weight):
        return LONE_ROWS
    if rows > 1 and packed_twin.batched_rows_agree(weight, rows):
        return ONE_ROW_PRODUCTS
    return ROW_LOOP


PLAN_PATHS = {True: "packed decode steps, exact", False: "packed decode steps, fast"}  # names in the proofs' registry
PREFILL_PATH = "packed prompts"
PROBE_TOKENS = ((1, 2, 3), (4, 5, 6, 7, 8))  # two visitors of different lengths for the parity probe
# prompts for the prompts' pass probe: a row of each kind engine/serving/prompt_rows.py tells apart
PROBE_PROMPTS = ((7,), (1, 2, 3), (4, 5, 6, 7, 8, 9), tuple(range(10, 23)))


def scripted_passes_apply(lm: LoadedModel) -> bool:
    """Whether `lm`'s packed passes may take the scripted passes, and exact batching may pack at
    all: only on the CPU, whose products the exact rows kernel copies and the probes were made
    for. On a GPU the library's kernels give a row of a packed pass other last bits than its lone
    pass (bench/gpu_bench.py measures it), so there `exact` runs every pass alone and `fast` packs
    on the eager twin."""
    return lm.device.type == "cpu"


def packed_pass_path(lm: LoadedModel, exact: bool = True) -> str:
    """Which pass a packed pass of `lm` takes, in a few words, and why."""
    if not scripted_passes_apply(lm):
        if exact:
            return (f"no packed pass: on {lm.device.type} no packed pass is proven to give each row its lone "
                    "digits, so exact batching runs every pass alone")
        return (f"the eager twin: the model runs on {lm.device.type}, and the scripted passes and the exact rows "
                "kernel are made for the CPU's products")
    if scripted_plan(lm, exact) is None:
        return "the eager twin: the scripted pass cannot run this model or its probe did not agree"
    return "the scripted pass"


def scripted_plan(lm: LoadedModel, exact: bool = True) -> ScriptedPlan | None:
    """The scripted pass for `lm`, or None where the model is not on the CPU or not a plain Llama
    decoder, the pass cannot be compiled, or its first probe pass does not give the eager twin's
    digits (logits and cache entries, compared with torch.equal); then the twin serves every
    packed pass."""
    if not scripted_passes_apply(lm):
        return None
    return settle(PLAN_PATHS[exact], lambda: _probed_plan(lm, exact), owner=lm.model, name=lm.name,
                  per_thread=False).value


@torch.inference_mode()
def _probed_plan(lm: LoadedModel, exact: bool) -> Verdict:
    weights = llama_weights(lm.model)
    run = compiled_pass()
    if (why_not := _why_not_scripted(lm, weights, run, twin_of=exact)) is not None:
        return refused(why_not)
    plan = ScriptedPlan(lm, run, weights, exact)
    twin_caches, plan_caches = ([_probe_cache(lm, ids)[1] for ids in PROBE_TOKENS] for _ in range(2))
    tokens = [9, 10]
    twin_logits = packed_twin.forward_twin(lm, tokens, twin_caches, exact)
    plan_logits = _forward_scripted(plan, tokens, plan_caches)
    if not (torch.equal(twin_logits, plan_logits) and _same_caches(twin_caches, plan_caches)):
        return refused("its probe pass differed from the eager twin's in logits or cache entries")
    return proven("probed equal to the eager twin, logits and cache, torch.equal", plan)


def _why_not_scripted(lm: LoadedModel, weights: LlamaWeights | None, run: Callable | None,
                      twin_of: bool | None = None) -> str | None:
    """Why a scripted pass cannot stand in for `lm`'s, or None where it may be probed (with
    `twin_of`, a packed pass: its eager twin of that kind must exist to be probed against)."""
    if weights is None:
        return "the model is not a plain Llama decoder"
    if run is None:
        return "TorchScript could not compile the pass"
    if twin_of is not None and packed_twin.packed_twin(lm, twin_of) is None:
        return "the model's attention has no packed twin to probe against"
    if not _sdpa_matches(lm, weights):
        return "transformers' sdpa attention makes another call than the scripted pass"
    return None


@dataclass(frozen=True)
class ScriptedPrefill:
    """The scripted prompts' pass for one model (it does not depend on the batching kind)."""

    lm: LoadedModel
    run: Callable
    weights: LlamaWeights

    def row_kinds(self) -> RowKinds | None:
        """Which product gives each prompt row its lone digits, at this thread's count."""
        return measure_row_kinds(self.weights.layers)

    def head_plan(self, prompts: int) -> tuple[list[int], int]:
        """How the head multiplies the prompts' last rows, each its own 1-row product: per slice
        of the head, and the slices' size (a prompt alone: the whole head, as its lone pass)."""
        chunk = ROWWISE_CHUNK if prompts > 1 else self.weights.head.shape[0]
        return [one_row_products_how(part, prompts) for part in head_slices(self.weights.head, chunk)], chunk


def scripted_prefill(lm: LoadedModel) -> ScriptedPrefill | None:
    """The scripted pass that reads several prompts into empty caches, or None where the model
    is not on the CPU or not a plain Llama decoder, it cannot be compiled, or its probe does not
    give each prompt's lone prefill's logits and cache (torch.equal)."""
    if not scripted_passes_apply(lm):
        return None
    return settle(PREFILL_PATH, lambda: _probed_prefill(lm), owner=lm.model, name=lm.name, per_thread=False).value


@torch.inference_mode()
def _probed_prefill(lm: LoadedModel) -> Verdict:
    weights = llama_weights(lm.model)
    run = compiled_prefill()
    if (why_not := _why_not_scripted(lm, weights, run)) is not None:
        return refused(why_not)
    prefill = ScriptedPrefill(lm, run, weights)
    if (kinds := prefill.row_kinds()) is None:
        return refused("some prompt row's digits come from no product the stacked pass makes")
    lone_logits, lone_caches = zip(*(_probe_cache(lm, ids) for ids in PROBE_PROMPTS), strict=True)
    caches = [new_cache(lm) for _ in PROBE_PROMPTS]
    logits = _prefill_scripted(prefill, kinds, PROBE_PROMPTS, caches)
    same = all(torch.equal(a, b) for a, b in zip(lone_logits, logits, strict=True))
    if not (same and _same_caches(lone_caches, caches)):
        return refused("its probe differed from lone prefills in logits or cache entries")
    return proven("probed equal to each prompt's lone prefill, logits and cache, torch.equal", prefill)


def _probe_cache(lm: LoadedModel, token_ids: Sequence[int]) -> tuple[torch.Tensor, DynamicCache]:
    """A lone prefill of `token_ids`: its next-token logits `[vocab]` and its cache."""
    cache = new_cache(lm)
    return forward(lm, torch.tensor([list(token_ids)]), cache)[0], cache


def _same_caches(caches: Sequence[DynamicCache], others: Sequence[DynamicCache]) -> bool:
    return all(same_entries(a, b) for a, b in zip(caches, others, strict=True))


def _sdpa_matches(lm: LoadedModel, weights: LlamaWeights) -> bool:
    """Whether transformers' sdpa attention makes, for one decode token, the call the scripted
    pass makes (with grouped heads: torch's own grouped-query attention)."""
    module = lm.model.get_decoder().layers[0].self_attn
    config = lm.model.config
    empty = torch.empty((1, config.num_key_value_heads, 1, weights.head_dim))
    options = packed_twin.sdpa_decode_options(sdpa_attention_forward, module, empty, empty)
    return options == ({"enable_gqa": True} if weights.gqa else {})


@torch.inference_mode()
def forward_prefills(lm: LoadedModel, prompts: Sequence[Sequence[int]], caches: Sequence[DynamicCache]
                     ) -> list[torch.Tensor]:
    """Each prompt's next-token logits `[vocab]` after reading it into its cache: its lone pass's
    numbers. A Llama-family model reads prompts into empty caches all in one call outside the
    GIL (engine/fast/scripted_llama.py prefill_logits); otherwise each is its own pass. If any fails,
    every cache is put back as it was and the error is raised."""
    prefill = scripted_prefill(lm)
    kinds = prefill.row_kinds() if prefill is not None else None
    lengths = [cache_length(cache) for cache in caches]
    try:
        if kinds is None or any(lengths) or any(type(c) is not DynamicCache for c in caches):
            return [forward(lm, torch.tensor([list(ids)]), c)[0] for ids, c in zip(prompts, caches, strict=True)]
        return _prefill_scripted(prefill, kinds, prompts, caches)
    except BaseException:
        for cache, length in zip(caches, lengths, strict=True):
            crop_cache(cache, length)
        raise


def _prefill_scripted(prefill: ScriptedPrefill, kinds: RowKinds, prompts: Sequence[Sequence[int]],
                      caches: Sequence[DynamicCache]) -> list[torch.Tensor]:
    weights, device = prefill.weights, prefill.lm.device
    lengths = [len(ids) for ids in prompts]
    starts = [sum(lengths[:p]) for p in range(len(lengths))]
    stacked = torch.tensor([[token for ids in prompts for token in ids]], device=device)  # end to end
    hidden = weights.embed(stacked)  # [1, rows, hidden]
    positions = torch.tensor([[place for n in lengths for place in range(n)]], device=device)  # each from 0
    cos, sin = weights.rotary(hidden, positions)
    rows = prompt_rows(kinds, lengths, device)
    last_rows = torch.tensor([start + n - 1 for start, n in zip(starts, lengths, strict=True)], device=device)
    head_hows, head_chunk = prefill.head_plan(len(prompts))
    with torch.jit.optimized_execution(False):
        logits, keys, values = prefill.run(hidden, cos, sin, starts, lengths, list(weights.layers), rows, last_rows,
                                           weights.eps, weights.head_dim, weights.scale, weights.gqa, weights.norm,
                                           weights.head, head_hows, head_chunk)
    for index, (key, value) in enumerate(zip(keys, values, strict=True)):  # the caches grow only now
        caches[index % len(caches)].update(key, value, index // len(caches))
    return [on_cpu(prefill.lm, row).clone() for row in logits[0]]  # each its own storage


def _forward_scripted(plan: ScriptedPlan, token_ids: Sequence[int], caches: Sequence[DynamicCache]) -> torch.Tensor:
    layer_hows, head_hows = plan.hows_for(len(caches))
    logits = run_decode(plan.run, plan.weights, layer_hows, head_hows, plan.head_chunk(), token_ids,
                                       caches)
    return on_cpu(plan.lm, logits)  # [rows, vocab]
