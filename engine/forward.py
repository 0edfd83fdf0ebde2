"""The model's forward pass, the one place the engine runs the model.

Generation, the speed measurements, speculative decoding and the batching scheduler
(engine/scheduler.py) all call this module: feed token ids, read the logits at the last
position (`forward_all`: at the last few positions, for speculative decoding's verify pass,
which needs one distribution per drafted token), and let the KV cache grow by the tokens fed.
`crop_cache` undoes that growth (Back, speculative decoding's rejected tokens, a timed step
repeated on the same context, a pass that failed part-way).

Two kinds of pass:
- `forward` / `forward_one`: one sequence (or several of equal length) through the model as
  transformers runs it. A visitor alone always gets this pass, so its numbers are
  transformers' own.
- `forward_packed`: one decode token for each of several visitors, packed as ONE sequence of B
  tokens. Attention is done row by row, each row against its own visitor's KV cache (of its
  own length; nothing is padded or copied into a batch). This runs on a twin of the model
  that shares its weights but dispatches attention to `packed_attention`, so the shared
  model's own attention never changes.

A packed pass comes in two kinds, because this CPU's matrix kernels are not batch-invariant:
a B-row matrix product sums each row in another order than a 1-row product, so a row's
logits from a batch differ from its lone pass's in the last bits (up to ~1e-4 measured on
SmolLM2-135M, bench/batch_parity.py).
- exact (the default): every linear layer gives each row its own 1-row product's digits. The
  scripted pass, from four rows, through a kernel that sums each row in the order the 1-row
  product does and reads each weight once for all rows (engine/lone_rows.py); otherwise, and
  in the eager twin (`RowwiseLinear`), as 1-row products, all rows in one batched call. Each
  visitor gets its lone pass's logits bit for bit.
- fast: one B-row matrix product per layer from the library.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward, use_gqa_in_sdpa
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from engine import lone_rows, packed_llama
from engine.loading import LoadedModel
from engine.prompt_rows import RowKinds, measure_row_kinds, prompt_rows

if TYPE_CHECKING:
    from engine.scheduler import ForwardScheduler

PACKED_ATTENTION = "token_by_token_packed"  # the twin model's attention implementation
LONE_ROWS_FROM = 4  # rows from which one pass over a weight beats batched 1-row products (measured: even at 3-4)
ROWWISE_CHUNK = 2048  # output features per slice of a large weight (2048 x 576 float32 = 4.5 MiB: stays in L3)


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
    """The head on a few positions `[keep, hidden] -> [keep, vocab]`, as W h^T. On the CPU,
    MKL multiplied a handful of rows by the 49,152 x 576 head 3 to 9 times slower as h W^T
    (F.linear's layout: 38 ms for 2 rows against 10 ms for 1) than as W h^T (3-10 ms)."""
    logits = (head.weight @ hidden.T).T  # [keep, vocab]
    return logits if head.bias is None else logits + head.bias


@torch.inference_mode()
def _logits(lm: LoadedModel, input_ids: torch.Tensor, cache: DynamicCache | None, keep: int) -> torch.Tensor:
    """The pass itself: logits `[batch, keep, vocab]` at the last `keep` positions fed, float32
    on the CPU. The language-model head runs on those positions only: the model's own call for
    one position (every decode step), W h^T for several positions of one sequence."""
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
    return _on_cpu(lm, out)


def forward(lm: LoadedModel, input_ids: torch.Tensor, cache: DynamicCache | None) -> torch.Tensor:
    """Logits at the last position `[batch, vocab]`, float32 on the CPU, for `input_ids`
    `[batch, new]` read after the `cache`'s positions (every row the same length). With a
    cache, it grows by `new` positions; without one, the pass reads only `input_ids`."""
    return _logits(lm, input_ids, cache, keep=1)[:, -1]


def forward_one(lm: LoadedModel, token_ids: list[int], cache: DynamicCache | None,
                scheduler: ForwardScheduler | None = None) -> torch.Tensor:
    """One sequence's next-token logits `[vocab]` after reading `token_ids`. With a
    `scheduler`, the pass waits its turn there (and may be batched with other visitors')."""
    if scheduler is not None and cache is not None:
        return scheduler.forward(token_ids, cache)
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
    return _logits(lm, torch.tensor([token_ids]), cache, keep=keep)[0]


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


# ---- packed decode: several visitors' next tokens in one pass ------------------------------

class PackedCaches:
    """The cache a packed pass sees: row i of the packed sequence belongs to `caches[i]`.

    `update` appends each row's new key and value to its own visitor's cache layer and hands
    attention every visitor's whole keys and values, one pair per row.
    """

    def __init__(self, caches: Sequence[DynamicCache]) -> None:
        self.caches = caches

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: object,
               **kwargs: object) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        # keys, values: [1, kv_heads, rows, head_dim]
        rows = [cache.layers[layer_idx].update(keys[:, :, i:i + 1], values[:, :, i:i + 1])
                for i, cache in enumerate(self.caches)]
        return [k for k, _ in rows], [v for _, v in rows]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions come from position_ids, never from here


def packed_attention(module: torch.nn.Module, query: torch.Tensor, keys: list[torch.Tensor],
                     values: list[torch.Tensor], attention_mask: torch.Tensor | None, scaling: float | None = None,
                     dropout: float = 0.0, **kwargs: object) -> tuple[torch.Tensor, None]:
    """Attention for a packed pass: each row's query `[1, heads, 1, head_dim]` against its own
    visitor's keys and values, through the lone pass's own attention, so this part gives the
    lone pass's digits exactly. Returns `[1, rows, heads, head_dim]`."""
    lone = ALL_ATTENTION_FUNCTIONS[module.config.lone_attention_implementation]
    pairs = list(zip(keys, values, strict=True))
    if (sdpa := _sdpa_decode_options(lone, module, keys[0], values[0])) is not None:
        # the very call sdpa_attention_forward makes for one decode token, without its checks
        # around each row (the packed pass makes one such call per visitor and layer)
        rows = [F.scaled_dot_product_attention(query[:, :, i:i + 1], k, v, attn_mask=None, dropout_p=0.0,
                                               scale=scaling, is_causal=False, **sdpa)
                for i, (k, v) in enumerate(pairs)]  # each [1, heads, 1, head_dim]
        return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None
    rows = [lone(module, query[:, :, i:i + 1], k, v, None, dropout=0.0, scaling=scaling)[0]
            for i, (k, v) in enumerate(pairs)]
    return torch.cat(rows, dim=1), None


def _sdpa_decode_options(lone: object, module: torch.nn.Module, key: torch.Tensor, value: torch.Tensor
                         ) -> dict[str, bool] | None:
    """The keyword arguments transformers' sdpa attention passes to torch for one decode token
    with no mask, or None where it would do something else (another attention, or grouped
    heads it packs instead)."""
    if lone is not sdpa_attention_forward:
        return None
    if getattr(module, "num_key_value_groups", 1) <= 1:
        return {}
    return {"enable_gqa": True} if use_gqa_in_sdpa(None, key, value) else None


AttentionInterface.register(PACKED_ATTENTION, packed_attention)


class RowwiseLinear(nn.Module):
    """A linear layer (the same weight tensors) that gives each row of `[1, rows, in]` the
    digits a 1-row pass gets: every row is its own 1-row product, through the kernel a lone
    pass uses. The rows go as ONE batched product of 1-row products (`torch.bmm` of
    `[rows, 1, in]` by the weight, broadcast, never copied), which a probe on the first packed
    pass of each shape checks against the row-by-row loop on this machine's kernels; a shape
    whose batched product differs keeps the loop. A weight too large for the CPU's cache (the
    output layer: 49,152 x 576) is taken in slices of ROWWISE_CHUNK outputs, all rows per
    slice, so it is read from memory once, not once per row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = self.weight.shape[0]
        out = x.new_empty((*x.shape[:-1], outputs))
        for start in range(0, outputs, ROWWISE_CHUNK):
            part = slice(start, start + ROWWISE_CHUNK)
            bias = None if self.bias is None else self.bias[part]
            out[..., part] = one_row_products(x, self.weight[part], bias)
        return out


def one_row_products(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for `x` `[1, rows, in]`, each row multiplied on its own."""
    rows = x.shape[-2]
    if bias is None and rows > 1 and _batched_rows_agree(weight, rows):
        products = packed_llama.one_row_products(x.reshape(rows, x.shape[-1]), weight)  # in one call
        return products.reshape(*x.shape[:-1], weight.shape[0])
    return torch.cat([F.linear(x[..., i:i + 1, :], weight, bias) for i in range(rows)], dim=-2)


_agreement: dict[tuple, bool] = {}  # (weight shape, strides, dtype, device, rows, threads) -> the probe's answer
_agreement_lock = threading.Lock()


def _batched_rows_agree(weight: torch.Tensor, rows: int) -> bool:
    """Whether a batched product of `rows` 1-row products gives the row-by-row loop's digits
    for a weight of this shape on this machine. Kernels choose their summation order by shape and
    thread count, not by value, so one probe on random numbers answers for that shape."""
    key = (tuple(weight.shape), weight.stride(), weight.dtype, weight.device, rows, torch.get_num_threads())
    with _agreement_lock:
        if key not in _agreement:
            probe = torch.randn((1, rows, weight.shape[1]), generator=torch.Generator().manual_seed(rows))
            probe = probe.to(device=weight.device, dtype=weight.dtype)
            loop = torch.cat([F.linear(probe[..., i:i + 1, :], weight) for i in range(rows)], dim=-2)
            batched = packed_llama.one_row_products(probe[0], weight)  # the very call the passes make
            _agreement[key] = torch.equal(batched.reshape(loop.shape), loop)
        return _agreement[key]


_twins: weakref.WeakKeyDictionary[PreTrainedModel, dict[bool, PreTrainedModel | None]] = weakref.WeakKeyDictionary()
_twins_lock = threading.Lock()


def packed_twin(lm: LoadedModel, exact: bool = True) -> PreTrainedModel | None:
    """The model's twin for packed passes: the same weight tensors (not copied) under a copy of
    its config whose attention is `packed_attention`; with `exact`, its linear layers are
    `RowwiseLinear`. None where the model's own attention has no per-row equivalent here (then
    the scheduler runs passes one at a time)."""
    with _twins_lock:
        twins = _twins.setdefault(lm.model, {})
        if exact not in twins:
            twins[exact] = _make_twin(lm.model, exact)
        return twins[exact]


def _make_twin(model: PreTrainedModel, exact: bool) -> PreTrainedModel | None:
    lone = model.config._attn_implementation
    if lone not in ALL_ATTENTION_FUNCTIONS or lone == PACKED_ATTENTION:
        return None
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    twin = copy.deepcopy(model, memo=shared)  # every tensor shared; modules and config copied
    twin.config._attn_implementation = PACKED_ATTENTION
    twin.config.lone_attention_implementation = lone
    if exact:
        for module in list(twin.modules()):
            for name, child in list(module.named_children()):
                if type(child) is nn.Linear:
                    setattr(module, name, RowwiseLinear(child))
    return twin


@torch.inference_mode()
def forward_packed(lm: LoadedModel, token_ids: Sequence[int], caches: Sequence[DynamicCache],
                   exact: bool = True, eager: bool = False) -> torch.Tensor:
    """Next-token logits `[rows, vocab]` for one new token per visitor: `token_ids[i]` read
    after `caches[i]`'s positions, each cache growing by one. Caches may differ in length.
    With `exact`, each row's logits are its lone pass's bit for bit; otherwise within ~1e-4.
    A Llama-family model runs the pass as one call outside the GIL (engine/packed_llama.py);
    any other model, or any with `eager` (a benchmark's comparison), on its twin. If the pass
    fails, every cache is left as it was and the error is raised."""
    plan = None if eager else scripted_plan(lm, exact)
    if plan is not None and _plain_layers(caches, len(plan.weights.layers) // packed_llama.LAYER_WEIGHTS):
        return _forward_scripted(plan, token_ids, caches)
    return _forward_twin(lm, token_ids, caches, exact)


def _forward_twin(lm: LoadedModel, token_ids: Sequence[int], caches: Sequence[DynamicCache],
                  exact: bool) -> torch.Tensor:
    twin = packed_twin(lm, exact)
    if twin is None:
        raise RuntimeError(f"{lm.name} cannot run packed passes (attention {lm.model.config._attn_implementation}).")
    lengths = [cache_length(cache) for cache in caches]
    device = lm.device
    try:
        out = twin(input_ids=torch.tensor([list(token_ids)], device=device),  # [1, rows]
                   position_ids=torch.tensor([lengths], device=device),  # each row at its own place
                   past_key_values=PackedCaches(caches), use_cache=True, logits_to_keep=0)
    except BaseException:
        for cache, length in zip(caches, lengths, strict=True):
            crop_cache(cache, length)
        raise
    return _on_cpu(lm, out.logits[0])  # [rows, vocab]


def _on_cpu(lm: LoadedModel, logits: torch.Tensor) -> torch.Tensor:
    """Logits as float32 on the CPU."""
    logits = logits.to(device="cpu", dtype=torch.float32)
    if lm.device.type == "cuda":  # report real durations: the pass has finished when this returns
        torch.cuda.synchronize(lm.device)
    return logits


# ---- the scripted packed pass (Llama family) ------------------------------------------------

@dataclass
class ScriptedPlan:
    """What a scripted packed pass needs for one model and batching kind: the compiled pass,
    the model's weights laid out for it, and, per row count, how each linear layer multiplies."""

    lm: LoadedModel
    run: Callable
    weights: packed_llama.LlamaWeights
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
            return packed_llama.ONE_PRODUCT
        return one_row_products_how(weight, rows)


def exact_rows_kernel_in_use(lm: LoadedModel) -> bool:
    """Whether exact packed passes of `lm` go through the exact rows kernel (engine/lone_rows.py):
    a scripted pass whose linear layers take it once there are rows enough."""
    plan = scripted_plan(lm, exact=True)
    return plan is not None and packed_llama.LONE_ROWS in plan.hows_for(LONE_ROWS_FROM)[0]


def head_slices(head: torch.Tensor, chunk: int) -> list[torch.Tensor]:
    """The language-model head in slices of `chunk` output features."""
    return [head[start:start + chunk] for start in range(0, head.shape[0], chunk)]


def one_row_products_how(weight: torch.Tensor, rows: int) -> int:
    """How `rows` rows each get their own 1-row product's digits by `weight`: from four rows, in
    one pass over the weight where the kernel gives those digits for this shape
    (engine/lone_rows.py); else in one batched call where the probe says it gives the row-by-row
    loop's digits; else one call a row."""
    if rows >= LONE_ROWS_FROM and lone_rows.kernel_agrees(weight):
        return packed_llama.LONE_ROWS
    if rows > 1 and _batched_rows_agree(weight, rows):
        return packed_llama.ONE_ROW_PRODUCTS
    return packed_llama.ROW_LOOP


_plans: weakref.WeakKeyDictionary[PreTrainedModel, dict[bool, ScriptedPlan | None]] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()
PROBE_TOKENS = ((1, 2, 3), (4, 5, 6, 7, 8))  # two visitors of different lengths for the parity probe
# prompts for the prompts' pass probe: a row of each kind engine/prompt_rows.py tells apart
PROBE_PROMPTS = ((7,), (1, 2, 3), (4, 5, 6, 7, 8, 9), tuple(range(10, 23)))


def scripted_plan(lm: LoadedModel, exact: bool = True) -> ScriptedPlan | None:
    """The scripted pass for `lm`, or None where the model is not a plain Llama decoder, the pass
    cannot be compiled, or its first probe pass does not give the eager twin's digits (logits
    and cache entries, compared with torch.equal); then the twin serves every packed pass."""
    with _plans_lock:
        plans = _plans.setdefault(lm.model, {})
        if exact not in plans:
            plans[exact] = _probed_plan(lm, exact)
        return plans[exact]


@torch.inference_mode()
def _probed_plan(lm: LoadedModel, exact: bool) -> ScriptedPlan | None:
    weights = packed_llama.llama_weights(lm.model)
    run = packed_llama.compiled_pass()
    if weights is None or run is None or packed_twin(lm, exact) is None or not _sdpa_matches(lm, weights):
        return None
    plan = ScriptedPlan(lm, run, weights, exact)
    twin_caches, plan_caches = ([_probe_cache(lm, ids)[1] for ids in PROBE_TOKENS] for _ in range(2))
    tokens = [9, 10]
    twin_logits = _forward_twin(lm, tokens, twin_caches, exact)
    plan_logits = _forward_scripted(plan, tokens, plan_caches)
    same = torch.equal(twin_logits, plan_logits) and _same_caches(twin_caches, plan_caches)
    return plan if same else None


@dataclass(frozen=True)
class ScriptedPrefill:
    """The scripted prompts' pass for one model (it does not depend on the batching kind)."""

    lm: LoadedModel
    run: Callable
    weights: packed_llama.LlamaWeights

    def row_kinds(self) -> RowKinds | None:
        """Which product gives each prompt row its lone digits, at this thread's count."""
        return measure_row_kinds(self.weights.layers)

    def head_plan(self, prompts: int) -> tuple[list[int], int]:
        """How the head multiplies the prompts' last rows, each its own 1-row product: per slice
        of the head, and the slices' size (a prompt alone: the whole head, as its lone pass)."""
        chunk = ROWWISE_CHUNK if prompts > 1 else self.weights.head.shape[0]
        return [one_row_products_how(part, prompts) for part in head_slices(self.weights.head, chunk)], chunk


_prefills: weakref.WeakKeyDictionary[PreTrainedModel, ScriptedPrefill | None] = weakref.WeakKeyDictionary()


def scripted_prefill(lm: LoadedModel) -> ScriptedPrefill | None:
    """The scripted pass that reads several prompts into empty caches, or None where the model
    is not a plain Llama decoder, it cannot be compiled, or its probe does not give each
    prompt's lone prefill's logits and cache (torch.equal)."""
    with _plans_lock:
        if lm.model not in _prefills:
            _prefills[lm.model] = _probed_prefill(lm)
        return _prefills[lm.model]


@torch.inference_mode()
def _probed_prefill(lm: LoadedModel) -> ScriptedPrefill | None:
    weights = packed_llama.llama_weights(lm.model)
    run = packed_llama.compiled_prefill()
    if weights is None or run is None or not _sdpa_matches(lm, weights):
        return None
    prefill = ScriptedPrefill(lm, run, weights)
    if (kinds := prefill.row_kinds()) is None:
        return None
    lone_logits, lone_caches = zip(*(_probe_cache(lm, ids) for ids in PROBE_PROMPTS), strict=True)
    caches = [new_cache(lm) for _ in PROBE_PROMPTS]
    logits = _prefill_scripted(prefill, kinds, PROBE_PROMPTS, caches)
    same = all(torch.equal(a, b) for a, b in zip(lone_logits, logits, strict=True))
    return prefill if same and _same_caches(lone_caches, caches) else None


def _probe_cache(lm: LoadedModel, token_ids: Sequence[int]) -> tuple[torch.Tensor, DynamicCache]:
    """A lone prefill of `token_ids`: its next-token logits `[vocab]` and its cache."""
    cache = new_cache(lm)
    return forward(lm, torch.tensor([list(token_ids)]), cache)[0], cache


def _same_caches(caches: Sequence[DynamicCache], others: Sequence[DynamicCache]) -> bool:
    return all(torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
               for a, b in zip(caches, others, strict=True) for ours, theirs in zip(a.layers, b.layers, strict=True))


def _sdpa_matches(lm: LoadedModel, weights: packed_llama.LlamaWeights) -> bool:
    """Whether transformers' sdpa attention makes, for one decode token, the call the scripted
    pass makes (with grouped heads: torch's own grouped-query attention)."""
    module = lm.model.get_decoder().layers[0].self_attn
    config = lm.model.config
    empty = torch.empty((1, config.num_key_value_heads, 1, weights.head_dim))
    options = _sdpa_decode_options(sdpa_attention_forward, module, empty, empty)
    return options == ({"enable_gqa": True} if weights.gqa else {})


@torch.inference_mode()
def forward_prefills(lm: LoadedModel, prompts: Sequence[Sequence[int]], caches: Sequence[DynamicCache]
                     ) -> list[torch.Tensor]:
    """Each prompt's next-token logits `[vocab]` after reading it into its cache: its lone pass's
    numbers. A Llama-family model reads prompts into empty caches all in one call outside the
    GIL (engine/packed_llama.py prefill_logits); otherwise each is its own pass. If any fails,
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
    return [_on_cpu(prefill.lm, row).clone() for row in logits[0]]  # each its own storage


def _plain_layers(caches: Sequence[DynamicCache], layers: int) -> bool:
    """Whether every cache is a plain, filled DynamicCache of `layers` layers: the scripted pass
    grows each layer as DynamicLayer.update does."""
    return all(len(cache.layers) == layers and all(type(layer) is DynamicLayer and layer.is_initialized
                                                   for layer in cache.layers) for cache in caches)


def _forward_scripted(plan: ScriptedPlan, token_ids: Sequence[int], caches: Sequence[DynamicCache]) -> torch.Tensor:
    weights, rows, device = plan.weights, len(caches), plan.lm.device
    hidden = weights.embed(torch.tensor([list(token_ids)], device=device))  # [1, rows, hidden]
    positions = torch.tensor([[cache_length(cache) for cache in caches]], device=device)  # each row at its own place
    cos, sin = weights.rotary(hidden, positions)  # [1, rows, head_dim]
    layers = len(caches[0].layers)
    keys = [cache.layers[layer].keys for layer in range(layers) for cache in caches]
    values = [cache.layers[layer].values for layer in range(layers) for cache in caches]
    layer_hows, head_hows = plan.hows_for(rows)
    with torch.jit.optimized_execution(False):  # run the ops as written: no graph rewrites
        logits, grown_keys, grown_values = plan.run(
            hidden, cos, sin, list(weights.layers), layer_hows, keys, values, weights.eps, weights.head_dim,
            weights.scale, weights.gqa, weights.norm, weights.head, head_hows, plan.head_chunk())
    # only now, with the pass complete, do the caches grow (a failed pass leaves them as they were)
    for index, (grown_key, grown_value) in enumerate(zip(grown_keys, grown_values, strict=True)):
        layer = caches[index % rows].layers[index // rows]
        layer.keys, layer.values = grown_key, grown_value
    return _on_cpu(plan.lm, logits[0])  # [rows, vocab]
