"""The eager packed pass: one decode token for each of several visitors, packed as ONE sequence
of B tokens, on a twin of the model.

Attention is done row by row, each row against its own visitor's KV cache (of its own length;
nothing is padded or copied into a batch). The twin shares the model's weights but dispatches
attention to `packed_attention`, so the shared model's own attention never changes. With
`exact`, its linear layers give each row its lone 1-row product's digits (`RowwiseLinear`).
Any model transformers can run gets this pass; a Llama-family model usually takes the scripted
pass instead (engine/serving/packed.py), which this twin checks bit for bit.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, DynamicCache, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward, use_gqa_in_sdpa
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from engine.fast import Verdict, proven, refused, settle, shape_name
from engine.fast import one_row_products as batched_one_row_products
from engine.forward import cache_length, crop_cache, on_cpu
from engine.loading import LoadedModel

PACKED_ATTENTION = "token_by_token_packed"  # the twin model's attention implementation
ROWWISE_CHUNK = 2048  # output features per slice of a large weight (2048 x 576 float32 = 4.5 MiB: stays in L3)


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
    if (sdpa := sdpa_decode_options(lone, module, keys[0], values[0])) is not None:
        # the very call sdpa_attention_forward makes for one decode token, without its checks
        # around each row (the packed pass makes one such call per visitor and layer)
        rows = [F.scaled_dot_product_attention(query[:, :, i:i + 1], k, v, attn_mask=None, dropout_p=0.0,
                                               scale=scaling, is_causal=False, **sdpa)
                for i, (k, v) in enumerate(pairs)]  # each [1, heads, 1, head_dim]
        return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None
    rows = [lone(module, query[:, :, i:i + 1], k, v, None, dropout=0.0, scaling=scaling)[0]
            for i, (k, v) in enumerate(pairs)]
    return torch.cat(rows, dim=1), None


def sdpa_decode_options(lone: object, module: torch.nn.Module, key: torch.Tensor, value: torch.Tensor
                         ) -> dict[str, bool] | None:
    """The keyword arguments transformers' sdpa attention passes to torch for one decode token
    with no mask, or None where it would do something else (another attention, or grouped
    heads it packs instead)."""
    if lone is not sdpa_attention_forward:
        return None
    if getattr(module, "num_key_value_groups", 1) <= 1:
        return {}
    return {"enable_gqa": True} if use_gqa_in_sdpa(None, key, value) else None



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
    if bias is None and rows > 1 and batched_rows_agree(weight, rows):
        products = batched_one_row_products(x.reshape(rows, x.shape[-1]), weight)  # in one call
        return products.reshape(*x.shape[:-1], weight.shape[0])
    return torch.cat([F.linear(x[..., i:i + 1, :], weight, bias) for i in range(rows)], dim=-2)


BATCHED_PATH = "batched 1-row products"  # the path's name in engine/fast/proofs.py's registry


def batched_rows_agree(weight: torch.Tensor, rows: int) -> bool:
    """Whether a batched product of `rows` 1-row products gives the row-by-row loop's digits
    for a weight of this shape on this machine. Kernels choose their summation order by shape and
    thread count, not by value, so one probe on random numbers answers for that shape."""
    def probe() -> Verdict:
        sample = torch.randn((1, rows, weight.shape[1]), generator=torch.Generator().manual_seed(rows))
        sample = sample.to(device=weight.device, dtype=weight.dtype)
        loop = torch.cat([F.linear(sample[..., i:i + 1, :], weight) for i in range(rows)], dim=-2)
        batched = batched_one_row_products(sample[0], weight)  # the very call the passes make
        if torch.equal(batched.reshape(loop.shape), loop):
            return proven("equal to the row-by-row loop on random rows, torch.equal")
        return refused("its rows differ from the row-by-row loop's on random rows", False)

    key = (tuple(weight.shape), weight.stride(), weight.dtype, weight.device, rows)
    return bool(settle(BATCHED_PATH, probe, name=f"{shape_name(weight)}, {rows} rows", key=key).value)


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
    AttentionInterface.register(PACKED_ATTENTION, packed_attention)  # only once a server packs passes
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


def forward_twin(lm: LoadedModel, token_ids: Sequence[int], caches: Sequence[DynamicCache],
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
    return on_cpu(lm, out.logits[0])  # [rows, vocab]
