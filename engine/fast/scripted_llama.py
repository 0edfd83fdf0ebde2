"""Packed passes for Llama-family models that run outside Python's GIL: several visitors'
decode steps (`packed_logits`), and several new visitors' prompts (`prefill_logits`, which
multiplies the prompts' rows as engine/serving/prompt_rows.py says: each row its lone digits).

Why: the eager packed pass (engine/serving/packed_twin.py) makes thousands of torch calls
for a class of visitors. Each call lets go of the GIL and takes it back, and in a busy server
every take waits behind a visitor's page script, which made the eager pass several times
slower beside busy script threads than alone (`python -m bench.gil_bench`; figures in docs/benchmarks.md). Here
the whole pass, every layer and every row, is one TorchScript call: the GIL is released once,
on entry, and taken back once.

The same torch operations, in the same order and on tensors of the same shapes, as
transformers' Llama decoder (RMSNorm, rotary embedding, per-row `scaled_dot_product_attention`
against each visitor's own keys and values, SiLU MLP) and as the eager packed pass, so the
digits are the same. engine/serving/packed.py checks that once per model on probe passes (against the
eager twin, and a prompt against its lone pass), and keeps the eager passes for a model where
they differ.

TorchScript is deprecated in recent torch releases but still runs; if it cannot compile this
module, the eager twin serves every pass. No `from __future__ import annotations` here:
TorchScript reads these functions' annotations as written.
"""

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from engine.fast import exact_rows_kernel
from engine.fast.proofs import Verdict, proven, refused, settle
from engine.fast.row_products import group_products, one_row_products

# how one linear layer multiplies a packed pass's rows (TorchScript cannot read module globals:
# the scripted functions below compare with these literals)
ONE_PRODUCT = 0  # one matrix product for all rows (fast batching)
ONE_ROW_PRODUCTS = 1  # each row its own 1-row product, all in one batched call (exact)
ROW_LOOP = 2  # each row its own 1-row product, one call a row (exact, where the batched call differs)
PROMPT_ROWS = 3  # prompts stacked end to end: each row through the product its lone prompt's pass uses
LONE_ROWS = 4  # every row in one pass over the weight, each summed as its 1-row product (exact_rows_kernel.py)
SEQUENCE_ROWS = 5  # LONE_ROWS for one sequence's rows (a verify pass): the same digits, the helper thread allowed

LAYER_WEIGHTS = 9  # per decoder layer: input norm, q, k, v, o, post-attention norm, gate, up, down
# a layer's products as a decode pass calls the kernel: query, key and value in one call, the output
# projection, gate and up in one call, down (indices into the layer's LAYER_WEIGHTS)
LAYER_PRODUCTS = ((1, 2, 3), (4,), (6, 7), (8,))


class PromptRows(NamedTuple):
    """Which rows of several prompts stacked end to end go through which matrix product, so
    that each row gets the digits of its own prompt's lone pass (engine/serving/prompt_rows.py)."""

    big: Tensor  # row indices multiplied together in one product
    small: Tensor  # row indices multiplied three to a product, a multiple of 3 (the last group padded with repeats)
    small_count: int  # rows of `small` that are not padding
    single: Tensor  # row indices multiplied one row to a product


def no_prompt_rows() -> PromptRows:
    """For a pass whose linear layers are not multiplied by PromptRows (a decode pass)."""
    empty = torch.empty(0, dtype=torch.long)
    return PromptRows(empty, empty, 0, empty)


def rms_norm(hidden: Tensor, weight: Tensor, eps: float) -> Tensor:
    """LlamaRMSNorm, op for op: in float32, scaled by the weight in the input's dtype."""
    dtype = hidden.dtype
    hidden32 = hidden.to(torch.float32)
    variance = hidden32.pow(2).mean(-1, keepdim=True)
    hidden32 = hidden32 * torch.rsqrt(variance + eps)
    return weight * hidden32.to(dtype)


def rows_linear(x: Tensor, weight: Tensor, how: int, prompt_rows: PromptRows) -> Tensor:
    """`x @ weight.T` for `x` `[1, rows, in]` -> `[1, rows, out]`, multiplied as `how` says
    (`prompt_rows` is read only by PROMPT_ROWS)."""
    rows = x.shape[1]
    if how == 0:  # ONE_PRODUCT
        return F.linear(x, weight)
    if how == 1:  # ONE_ROW_PRODUCTS
        return one_row_products(x[0], weight).unsqueeze(0)
    if how == 3:  # PROMPT_ROWS
        return prompts_linear(x[0], weight, prompt_rows).unsqueeze(0)
    if how == 4 or how == 5:  # LONE_ROWS, SEQUENCE_ROWS
        return kernel_linears(x[0], [weight], how)[0].unsqueeze(0)
    parts: list[Tensor] = []
    for i in range(rows):
        parts.append(F.linear(x[:, i:i + 1], weight))
    return torch.cat(parts, dim=1)


def kernel_linears(x: Tensor, weights: list[Tensor], how: int) -> list[Tensor]:
    """`[rows, in]` through several weights of that input width in one call of the exact rows
    kernel: LONE_ROWS, or SEQUENCE_ROWS (one sequence's rows: the kernel's helper thread allowed)."""
    if how == 5:  # SEQUENCE_ROWS
        return torch.ops.token_by_token.sequence_rows_linears(x, weights)
    return torch.ops.token_by_token.lone_rows_linears(x, weights)


def prompts_linear(x: Tensor, weight: Tensor, prompt_rows: PromptRows) -> Tensor:
    """`[rows, in] -> [rows, out]` for prompts stacked end to end: the big rows in one product,
    the small ones three to a product (in one batched call), each single row alone."""
    out = x.new_empty((x.shape[0], weight.shape[0]))
    big, small, single = prompt_rows.big, prompt_rows.small, prompt_rows.single
    if big.numel() > 0:
        out.index_copy_(0, big, F.linear(x.index_select(0, big), weight))
    if prompt_rows.small_count > 0:
        products = group_products(x.index_select(0, small), weight, 3)  # SMALL_GROUP (engine/serving/prompt_rows.py)
        out.index_copy_(0, small[:prompt_rows.small_count], products[:prompt_rows.small_count])
    for i in range(single.numel()):
        row = int(single[i])
        out[row:row + 1] = F.linear(x[row:row + 1], weight)
    return out


def sliced_linear(x: Tensor, weight: Tensor, hows: list[int], chunk: int) -> Tensor:
    """`rows_linear` over slices of `chunk` output features (slice j multiplied as `hows[j]`):
    a weight too large for the CPU's cache is read from memory once for all rows."""
    parts: list[Tensor] = []
    no_rows = no_prompt_rows()
    for j, how in enumerate(hows):
        parts.append(rows_linear(x, weight[j * chunk:(j + 1) * chunk], how, no_rows))
    return torch.cat(parts, dim=-1)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotated_projections(hidden: Tensor, w: list[Tensor], how: list[int], eps: float, head_dim: int, cos: Tensor,
                        sin: Tensor, prompt_rows: PromptRows) -> tuple[Tensor, Tensor, Tensor]:
    """A layer's attention inputs for `hidden` `[1, n, hidden]`: the input norm, then query, key
    and value `[1, heads, n, head_dim]`, query and key rotated (`cos`, `sin` `[1, 1, n, head_dim]`).
    `w` and `how`: the layer's LAYER_WEIGHTS weights and how each multiplies."""
    n = hidden.shape[1]
    normed = rms_norm(hidden, w[0], eps)
    if (how[1] == 4 or how[1] == 5) and how[2] == how[1] and how[3] == how[1]:  # the kernel: one call for all three
        q, k, v = kernel_linears(normed[0], [w[1], w[2], w[3]], how[1])
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    else:
        q = rows_linear(normed, w[1], how[1], prompt_rows)
        k = rows_linear(normed, w[2], how[2], prompt_rows)
        v = rows_linear(normed, w[3], how[3], prompt_rows)
    query = q.view(1, n, -1, head_dim).transpose(1, 2)
    key = k.view(1, n, -1, head_dim).transpose(1, 2)
    value = v.view(1, n, -1, head_dim).transpose(1, 2)
    return (query * cos) + (rotate_half(query) * sin), (key * cos) + (rotate_half(key) * sin), value


def after_attention(residual: Tensor, attended: Tensor, w: list[Tensor], how: list[int], eps: float,
                    prompt_rows: PromptRows) -> Tensor:
    """The rest of a layer from its attention output `[1, heads, n, head_dim]`: the output
    projection and residual, then the post-attention norm, the SiLU MLP and its residual."""
    return mlp_block(attention_output(residual, attended, w, how, prompt_rows), w, how, eps, prompt_rows)


def attention_output(residual: Tensor, attended: Tensor, w: list[Tensor], how: list[int],
                     prompt_rows: PromptRows) -> Tensor:
    """The attention output `[1, heads, n, head_dim]` through the output projection, added to the residual."""
    n = residual.shape[1]
    attended = attended.transpose(1, 2).contiguous().reshape(1, n, -1).contiguous()
    return residual + rows_linear(attended, w[4], how[4], prompt_rows)


def mlp_block(hidden: Tensor, w: list[Tensor], how: list[int], eps: float, prompt_rows: PromptRows) -> Tensor:
    """The post-attention norm, the SiLU MLP and its residual."""
    normed = rms_norm(hidden, w[5], eps)
    if (how[6] == 4 or how[6] == 5) and how[7] == how[6]:  # the kernel: gate and up in one call
        gate, up = kernel_linears(normed[0], [w[6], w[7]], how[6])
        gated = F.silu(gate.unsqueeze(0)) * up.unsqueeze(0)
    else:
        gated = F.silu(rows_linear(normed, w[6], how[6], prompt_rows)) * rows_linear(normed, w[7], how[7], prompt_rows)
    return hidden + rows_linear(gated, w[8], how[8], prompt_rows)


def attend_row(query: Tensor, key: Tensor, value: Tensor, i: int, keys: Tensor, values: Tensor, scale: float,
               gqa: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Row i's attention in a decode pass: its query `[1, heads, 1, head_dim]` against its own
    cache's keys and values grown by its token. `keys`, `values`: the cache with one free position
    after it (`[1, kv_heads, length + 1, head_dim]`, see `room_to_grow`), where the token's key and
    value are written; returns the output and those keys and values, now grown."""
    length = keys.shape[-2] - 1
    keys[:, :, length:].copy_(key[:, :, i:i + 1])
    values[:, :, length:].copy_(value[:, :, i:i + 1])
    attended = F.scaled_dot_product_attention(query[:, :, i:i + 1], keys, values, attn_mask=None,
                                              dropout_p=0.0, is_causal=False, scale=scale, enable_gqa=gqa)
    return attended, keys, values


def decoder_pass(hidden: Tensor, cos: Tensor, sin: Tensor, weights: list[Tensor], hows: list[int],
                 keys: list[Tensor], values: list[Tensor], eps: float, head_dim: int, scale: float,
                 gqa: bool) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """Every decoder layer for a packed pass of `rows` tokens (`hidden` `[1, rows, hidden]`, row
    i at its own position: `cos`, `sin` `[1, rows, head_dim]`). `keys[layer * rows + i]` is row
    i's cache at that layer with a free position after it `[1, kv_heads, length_i + 1, head_dim]`
    (`room_to_grow`). Returns the last layer's hidden states and each (layer, row)'s keys and
    values grown by the row's token (written in that free position), in the same order."""
    rows, per_layer = hidden.shape[1], 9  # LAYER_WEIGHTS
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    no_rows = no_prompt_rows()
    grown_keys: list[Tensor] = []
    grown_values: list[Tensor] = []
    for layer in range(len(weights) // per_layer):
        w = weights[layer * per_layer:(layer + 1) * per_layer]
        how = hows[layer * per_layer:(layer + 1) * per_layer]
        query, key, value = rotated_projections(hidden, w, how, eps, head_dim, cos, sin, no_rows)
        outputs: list[Tensor] = []
        for i in range(rows):  # each row against its own visitor's cache
            attended, row_keys, row_values = attend_row(query, key, value, i, keys[layer * rows + i],
                                                        values[layer * rows + i], scale, gqa)
            grown_keys.append(row_keys)
            grown_values.append(row_values)
            outputs.append(attended)
        hidden = after_attention(hidden, torch.cat(outputs, dim=2), w, how, eps, no_rows)
    return hidden, grown_keys, grown_values


def packed_logits(hidden: Tensor, cos: Tensor, sin: Tensor, weights: list[Tensor], hows: list[int],
                  keys: list[Tensor], values: list[Tensor], eps: float, head_dim: int, scale: float, gqa: bool,
                  norm_weight: Tensor, head_weight: Tensor, head_hows: list[int], head_chunk: int
                  ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """`decoder_pass`, the final norm and the language-model head: logits `[1, rows, vocab]`."""
    hidden, grown_keys, grown_values = decoder_pass(hidden, cos, sin, weights, hows, keys, values, eps, head_dim,
                                                    scale, gqa)
    hidden = rms_norm(hidden, norm_weight, eps)
    return sliced_linear(hidden, head_weight, head_hows, head_chunk), grown_keys, grown_values


def verify_logits(hidden: Tensor, cos: Tensor, sin: Tensor, weights: list[Tensor], hows: list[int],
                  keys: list[Tensor], values: list[Tensor], eps: float, head_dim: int, scale: float, gqa: bool,
                  norm_weight: Tensor, head_weight: Tensor, head_hows: list[int], head_chunk: int
                  ) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor]]:
    """`n` tokens of one sequence read after its cache in one pass (speculative decoding's verify
    pass), each row with the digits of the one-token decode step that would read it: `hidden`
    `[1, n, hidden]`, row i at the cache's length + i (`cos`, `sin` `[1, n, head_dim]`); every
    linear layer multiplies each row as its own 1-row product (LONE_ROWS), and row i's query
    meets the cache's keys and those of rows 0 to i, grown as i + 1 steps would have grown them.
    `keys[layer]`: the cache's keys at that layer. Returns the logits `[1, n, vocab]`, the
    decoder's last state after the final norm `[1, n, hidden]`, and each layer's keys and values
    grown by all n tokens; the caches passed in are not changed."""
    n, per_layer = hidden.shape[1], 9  # LAYER_WEIGHTS
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    no_rows = no_prompt_rows()
    grown_keys: list[Tensor] = []
    grown_values: list[Tensor] = []
    for layer in range(len(weights) // per_layer):
        w = weights[layer * per_layer:(layer + 1) * per_layer]
        how = hows[layer * per_layer:(layer + 1) * per_layer]
        query, key, value = rotated_projections(hidden, w, how, eps, head_dim, cos, sin, no_rows)
        # the cache grown by all n at once: row i's keys are its first length + i + 1, the very
        # values i + 1 decode steps would have grown it to (one copy a layer, not one a row)
        length = keys[layer].shape[-2]
        all_keys = torch.cat([keys[layer], key], dim=-2)
        all_values = torch.cat([values[layer], value], dim=-2)
        outputs: list[Tensor] = []
        for i in range(n):  # as a decode step: one query over the keys it would meet
            outputs.append(F.scaled_dot_product_attention(query[:, :, i:i + 1], all_keys[:, :, :length + i + 1],
                                                          all_values[:, :, :length + i + 1], attn_mask=None,
                                                          dropout_p=0.0, is_causal=False, scale=scale,
                                                          enable_gqa=gqa))
        grown_keys.append(all_keys)
        grown_values.append(all_values)
        hidden = after_attention(hidden, torch.cat(outputs, dim=2), w, how, eps, no_rows)
    normed = rms_norm(hidden, norm_weight, eps)
    return sliced_linear(normed, head_weight, head_hows, head_chunk), normed, grown_keys, grown_values


def prefill_logits(hidden: Tensor, cos: Tensor, sin: Tensor, starts: list[int], lengths: list[int],
                   weights: list[Tensor], prompt_rows: PromptRows, last_rows: Tensor, eps: float, head_dim: int,
                   scale: float, gqa: bool, norm_weight: Tensor, head_weight: Tensor, head_hows: list[int],
                   head_chunk: int) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """Several prompts' prefills in one call, each with its lone prefill's digits. The prompts
    are stacked end to end (`hidden` `[1, rows, hidden]`, prompt p at rows `starts[p]` to
    `starts[p] + lengths[p]`, each at its own positions: `cos`, `sin` `[1, rows, head_dim]`).
    Linear layers multiply each row as `prompt_rows` says; attention is each prompt's own, on
    its own rows, as its lone pass does it. Returns the logits at `last_rows` (each prompt's
    last row) `[1, prompts, vocab]`, and each prompt's keys and values
    `[1, kv_heads, n_p, head_dim]` for (layer, prompt), layer by layer."""
    per_layer = 9  # LAYER_WEIGHTS
    by_prompt_rows = [3, 3, 3, 3, 3, 3, 3, 3, 3]  # PROMPT_ROWS for every weight
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    all_keys: list[Tensor] = []
    all_values: list[Tensor] = []
    for layer in range(len(weights) // per_layer):
        w = weights[layer * per_layer:(layer + 1) * per_layer]
        query, key, value = rotated_projections(hidden, w, by_prompt_rows, eps, head_dim, cos, sin, prompt_rows)
        outputs: list[Tensor] = []
        for p in range(len(starts)):
            start, n = starts[p], lengths[p]
            prompt_key = key[:, :, start:start + n].contiguous()  # as an empty cache's update copies them
            prompt_value = value[:, :, start:start + n].contiguous()
            all_keys.append(prompt_key)
            all_values.append(prompt_value)
            outputs.append(F.scaled_dot_product_attention(query[:, :, start:start + n], prompt_key, prompt_value,
                                                          attn_mask=None, dropout_p=0.0, is_causal=n > 1, scale=scale,
                                                          enable_gqa=gqa))
        hidden = after_attention(hidden, torch.cat(outputs, dim=2), w, by_prompt_rows, eps, prompt_rows)
    last = rms_norm(hidden.index_select(1, last_rows), norm_weight, eps)
    return sliced_linear(last, head_weight, head_hows, head_chunk), all_keys, all_values


def lone_attention(hidden: Tensor, cos: Tensor, sin: Tensor, w: list[Tensor], how: list[int], keys: Tensor,
                   values: Tensor, eps: float, head_dim: int, scale: float, gqa: bool
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One layer's attention half for one decode token, op for op as `decoder_pass` makes it for
    a row (`cos`, `sin` `[1, 1, 1, head_dim]`, already unsqueezed): the hidden state after the
    attention's residual, the rotated query `[1, heads, 1, head_dim]`, and the layer's keys and
    values grown by the token (`keys`, `values`: with a free position for it, as `attend_row`
    takes them). A pass made of these,
    `lone_mlp` and `lone_head` layer by layer gives `packed_logits`' digits for one row."""
    no_rows = no_prompt_rows()
    query, key, value = rotated_projections(hidden, w, how, eps, head_dim, cos, sin, no_rows)
    attended, grown_key, grown_value = attend_row(query, key, value, 0, keys, values, scale, gqa)
    return attention_output(hidden, attended, w, how, no_rows), query, grown_key, grown_value


def lone_mlp(hidden: Tensor, w: list[Tensor], how: list[int], eps: float) -> Tensor:
    """One layer's MLP half for one decode token (see `lone_attention`)."""
    return mlp_block(hidden, w, how, eps, no_prompt_rows())


def lone_head(hidden: Tensor, norm_weight: Tensor, eps: float, head_weight: Tensor, head_hows: list[int],
              head_chunk: int) -> Tensor:
    """The final norm and the language-model head for one decode token: logits `[1, 1, vocab]`."""
    return sliced_linear(rms_norm(hidden, norm_weight, eps), head_weight, head_hows, head_chunk)


def grows_layer_by_layer(cache: DynamicCache, layers: int) -> bool:
    """Whether `cache` holds `layers` filled plain DynamicLayers: what `run_decode` grows, as
    DynamicLayer.update does."""
    return len(cache.layers) == layers and all(type(layer) is DynamicLayer and layer.is_initialized
                                               for layer in cache.layers)


KV_BLOCK = 64  # positions a cache grows by when a decode pass needs room


@dataclass
class KVBlock:
    """A cache's keys and values with room after them, every layer in one tensor: the layers'
    tensors are views of its first positions, and a decode step writes its token in place.
    Growing by torch.cat copied the whole cache into new tensors every step and freed the old
    ones, sizes that never repeat: the server's heap kept the holes, and its memory grew with a
    lesson well beyond the cache itself (docs/class.md)."""

    tensor: Tensor  # [layers, 2 (keys, values), batch, kv_heads, capacity, head_dim]
    shown: list[tuple[Tensor, Tensor]] | None = None  # the views the layers hold since the last step


def room_to_grow(cache: DynamicCache) -> tuple[list[Tensor], list[Tensor], KVBlock]:
    """Each layer's keys and values with one free position after them, and the block they are
    views of. The cache's own block is used while its layers still hold the views that block
    gave them; otherwise (grown by transformers' pass, cropped by a rewind, a prefix sharing
    another cache's tensors, no block yet) their positions are copied into a new block. So a
    position is only ever written past the end of every view handed out: no tensor a caller
    kept (an earlier step's keys, a prefix cache) changes."""
    layers = cache.layers
    lengths = [layer.keys.shape[-2] for layer in layers]
    block = getattr(cache, "tbt_kv_block", None)
    owned = (block is not None and block.shown is not None and block.tensor.shape[-2] > max(lengths)
             and all(layer.keys is keys and layer.values is values
                     for layer, (keys, values) in zip(layers, block.shown, strict=True)))
    if not owned:
        first = layers[0].keys
        capacity = (max(lengths) // KV_BLOCK + 1) * KV_BLOCK
        block = KVBlock(first.new_empty((len(layers), 2, *first.shape[:-2], capacity, first.shape[-1])))
        for index, (layer, length) in enumerate(zip(layers, lengths, strict=True)):
            block.tensor[index, 0, ..., :length, :].copy_(layer.keys)
            block.tensor[index, 1, ..., :length, :].copy_(layer.values)
    keys = [block.tensor[index, 0, ..., :length + 1, :] for index, length in enumerate(lengths)]
    values = [block.tensor[index, 1, ..., :length + 1, :] for index, length in enumerate(lengths)]
    return keys, values, block


def keep_grown(cache: DynamicCache, block: KVBlock, keys: Sequence[Tensor], values: Sequence[Tensor]) -> None:
    """The cache grown by a complete pass: `keys`, `values` are the views of `block` it wrote, a layer each."""
    for layer, grown_keys, grown_values in zip(cache.layers, keys, values, strict=True):
        layer.keys, layer.values = grown_keys, grown_values
    block.shown = list(zip(keys, values, strict=True))
    cache.tbt_kv_block = block


def run_decode(run: Callable, weights: "LlamaWeights", layer_hows: list[int], head_hows: list[int], head_chunk: int,
               token_ids: Sequence[int], caches: Sequence[DynamicCache]) -> Tensor:
    """One decode token per cache through the compiled `packed_logits` (`run`): logits
    `[rows, vocab]` on the model's device. Each cache (plain DynamicCache, every layer filled)
    grows by its row's token only once the pass is complete: a failed pass leaves them as they were."""
    device = weights.head.device
    hidden = weights.embed(torch.tensor([list(token_ids)], device=device))  # [1, rows, hidden]
    positions = torch.tensor([[cache.get_seq_length() for cache in caches]], device=device)  # each row at its own place
    cos, sin = weights.rotary(hidden, positions)  # [1, rows, head_dim]
    rows, layers = len(caches), len(caches[0].layers)
    rooms = [room_to_grow(cache) for cache in caches]
    keys = [rooms[row][0][layer] for layer in range(layers) for row in range(rows)]  # layer by layer, a row each
    values = [rooms[row][1][layer] for layer in range(layers) for row in range(rows)]
    with torch.jit.optimized_execution(False):  # run the ops as written: no graph rewrites
        logits, grown_keys, grown_values = run(hidden, cos, sin, list(weights.layers), layer_hows, keys, values,
                                               weights.eps, weights.head_dim, weights.scale, weights.gqa,
                                               weights.norm, weights.head, head_hows, head_chunk)
    for row, (cache, room) in enumerate(zip(caches, rooms, strict=True)):
        keep_grown(cache, room[2], grown_keys[row::rows], grown_values[row::rows])
    return logits[0]


def run_verify(run: Callable, weights: "LlamaWeights", layer_hows: list[int], head_hows: list[int], head_chunk: int,
               token_ids: Sequence[int], cache: DynamicCache) -> tuple[Tensor, Tensor]:
    """`token_ids` read after `cache` (plain DynamicCache, every layer filled) through the compiled
    `verify_logits` (`run`): the logits `[n, vocab]` and the normed last state `[n, hidden]`. The
    cache grows by the n tokens only once the pass is complete."""
    device = weights.head.device
    hidden = weights.embed(torch.tensor([list(token_ids)], device=device))  # [1, n, hidden]
    start = cache.get_seq_length()
    positions = torch.arange(start, start + len(token_ids), device=device).unsqueeze(0)
    cos, sin = weights.rotary(hidden, positions)  # [1, n, head_dim]
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    with torch.jit.optimized_execution(False):  # run the ops as written: no graph rewrites
        logits, normed, grown_keys, grown_values = run(hidden, cos, sin, list(weights.layers), layer_hows, keys,
                                                       values, weights.eps, weights.head_dim, weights.scale,
                                                       weights.gqa, weights.norm, weights.head, head_hows,
                                                       head_chunk)
    for layer, grown_key, grown_value in zip(cache.layers, grown_keys, grown_values, strict=True):
        layer.keys, layer.values = grown_key, grown_value
    return logits[0], normed[0]


COMPILE_PATH = "scripted passes"  # the path's name in engine/fast/proofs.py's registry


def compiled_pass() -> Callable | None:
    """`packed_logits` compiled by TorchScript (once), or None where it cannot be compiled."""
    return _compiled_functions().get("decode")


def compiled_verify() -> Callable | None:
    """`verify_logits` compiled by TorchScript (once), or None where it cannot be compiled."""
    return _compiled_functions().get("verify")


def compiled_prefill() -> Callable | None:
    """`prefill_logits` compiled by TorchScript (once), or None where it cannot be compiled."""
    return _compiled_functions().get("prefill")


class LayerParts(NamedTuple):
    """The decode pass in parts, compiled: what a pass that looks inside times one by one."""

    attention: Callable  # lone_attention
    mlp: Callable  # lone_mlp
    head: Callable  # lone_head


def compiled_layer_parts() -> LayerParts | None:
    """`lone_attention`, `lone_mlp` and `lone_head` compiled by TorchScript (once), or None."""
    found = _compiled_functions()
    return LayerParts(found["attention"], found["mlp"], found["head"]) if "attention" in found else None


def _compiled_functions() -> dict[str, Callable]:
    """Every scripted pass compiled by TorchScript, once; empty where any cannot be compiled."""
    return settle(COMPILE_PATH, _compile, per_thread=False).value


def _compile() -> Verdict:
    exact_rows_kernel.kernel_available()  # registers the op the passes name (compiled, or a stand-in)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # still supported; see the module docstring
            compiled = dict(decode=torch.jit.script(packed_logits), prefill=torch.jit.script(prefill_logits),
                            verify=torch.jit.script(verify_logits), attention=torch.jit.script(lone_attention),
                            mlp=torch.jit.script(lone_mlp), head=torch.jit.script(lone_head))
    except Exception as error:  # any failure to compile leaves the eager passes in charge
        return refused(f"TorchScript could not compile them ({type(error).__name__})", {}, warn=True)
    return proven("compiled by TorchScript (each pass is probed against its eager one before use)", compiled)


@dataclass(frozen=True)
class LlamaWeights:
    """What the scripted pass reads from a Llama-family model: the weight tensors themselves,
    never copied."""

    embed: nn.Embedding
    rotary: nn.Module  # the model's own rotary embedding: cos and sin for any rope scaling
    layers: tuple[Tensor, ...]  # LAYER_WEIGHTS per layer, in decoder_pass's order
    norm: Tensor
    head: Tensor
    eps: float
    head_dim: int
    scale: float
    gqa: bool


def llama_weights(model: nn.Module) -> LlamaWeights | None:
    """The model's weights laid out for `decoder_pass`, or None where the model is not a plain
    Llama decoder (another architecture, biases, another activation or norm, another attention)."""
    config = model.config
    decoder = getattr(model, "model", None)
    plain = (config.model_type == "llama" and config._attn_implementation == "sdpa"
             and not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False)
             and config.hidden_act == "silu" and decoder is not None
             and type(model.get_output_embeddings()) is nn.Linear and model.get_output_embeddings().bias is None)
    if not plain:
        return None
    layers: list[Tensor] = []
    for layer in decoder.layers:
        attention, mlp = layer.self_attn, layer.mlp
        projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj,
                       mlp.up_proj, mlp.down_proj)
        if any(type(p) is not nn.Linear for p in projections):  # quantised or wrapped: not these products
            return None
        layers += [layer.input_layernorm.weight, attention.q_proj.weight, attention.k_proj.weight,
                   attention.v_proj.weight, attention.o_proj.weight, layer.post_attention_layernorm.weight,
                   mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
    attention = decoder.layers[0].self_attn
    return LlamaWeights(embed=decoder.embed_tokens, rotary=decoder.rotary_emb, layers=tuple(layers),
                        norm=decoder.norm.weight, head=model.get_output_embeddings().weight,
                        eps=float(decoder.norm.variance_epsilon), head_dim=int(attention.head_dim),
                        scale=float(attention.scaling), gqa=attention.num_key_value_groups > 1)
