"""Inside the forward pass: what each layer would predict, where the new token's query looks,
and what each layer costs, read from one pass of the real model.

The pass runs on a twin of the model: the same weight tensors (nothing copied) under a copy of
its config whose attention function first calls the model's own (so every output is the
model's, bit for bit: a probe checks logits and cache entries with torch.equal before the twin
is used) and then keeps the last position's query, the keys the cache holds and the mask it was
given. Hooks on the twin's modules keep each layer's output at the last position and the time
each part took. The shared model itself is never hooked, so other visitors' passes cannot see
or slow this one.

A decode step (one token after a filled cache) goes faster where the fast lone pass runs
(engine/fast/lone.py): the same pass made layer by layer, each half a compiled call, timed from
here, with its states and queries kept. So looking inside costs a step little more than not
looking. It is used only after a probe at this thread count has found it giving the twin's
logits, cache entries, states and attention weights, all `torch.equal`; elsewhere the twin runs.

- Logit lens (raw: no trained translator): the decoder's input and each layer's output at the
  last position, through the model's final norm (each row with its own statistics) and the LM
  head, softmax. The last layer's lens is the step's own distribution: the model's logits. The
  rows below it go through the head in one pass over its weight (engine/fast/lens_kernel.py):
  the CPU's matrix product is slow on the whole head at once (`python -m bench.inside_bench`).
- Attention: softmax(q · Kᵀ · scaling + mask) for the fed token's query against every cached
  key, per query head (with grouped-query attention, query head h reads KV head h // group).
- Time: per layer, its attention and its MLP, measured in the pass; bytes: each layer's weights
  and the keys and values it reads, and the LM head's weights.
"""

from __future__ import annotations

import copy
import math
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AttentionInterface, DynamicCache, PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from engine.errors import SettingsError
from engine.fast import (
    LayerParts,
    LonePass,
    Verdict,
    compiled_layer_parts,
    lens_kernel_usable,
    lens_linear,
    lens_statistics,
    lone_pass,
    plain_filled,
    proven,
    refused,
    settle,
)
from engine.forward import cache_length, crop_cache, eager_step, new_cache, on_cpu, plain_head
from engine.kvcache import same_entries
from engine.loading import LoadedModel
from engine.sampling import entropy_bits

INSIDE_ATTENTION = "token_by_token_inside"  # the twin's attention implementation
PROBE_IDS = (1, 2, 3, 4, 5, 6)  # a short prompt for the twin's probe



@dataclass(frozen=True)
class LayerView:
    """One layer (0 = the embeddings entering the first decoder layer) as the lens sees it."""

    layer: int
    top_token_id: int
    top_text: str
    top_prob: float
    pick_prob: float  # the step's pick, had the model stopped here
    pick_rank: int  # 1 = the top token
    entropy_bits: float
    attention_ms: float | None  # measured in the pass; None for layer 0 (no attention)
    mlp_ms: float | None
    ms: float  # the whole layer (the embedding lookup for layer 0)
    weight_bytes: int  # the layer's parameters, read once per pass
    kv_bytes: int  # the keys and values the fed token's query read at this layer
    attention: tuple[tuple[float, ...], ...] | None  # per query head: weights over positions 0..position


@dataclass(frozen=True)
class InsideView:
    """Inside one step's forward pass."""

    step: int
    position: int  # the fed token's place (its query is the one shown)
    hidden_size: int  # the numbers in the state each layer adds to (the residual stream)
    layers: tuple[LayerView, ...]  # 0 .. L
    first_lead: int | None  # the first layer from which on the pick is the lens's top token
    kv_head_of: tuple[int, ...]  # per query head, the KV head it reads
    head_ms: float  # the final norm and the LM head
    head_bytes: int
    forward_ms: float  # the whole pass as measured around it
    unavailable: tuple[str, ...]  # parts this model cannot give, each with why

    def layer(self, index: int) -> LayerView:
        """Layer `index`: 0 (the embeddings) to L (the last layer)."""
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.layers):
            raise SettingsError("layer", index, f"a whole number from 0 to {len(self.layers) - 1}")
        return self.layers[index]

    def to_dict(self) -> dict:
        """Plain JSON-ready data, as traces and the CLI write it."""
        return {"step": self.step, "position": self.position, "hidden_size": self.hidden_size,
                "first_lead": self.first_lead,
                "kv_head_of": list(self.kv_head_of), "head_ms": self.head_ms, "head_bytes": self.head_bytes,
                "forward_ms": self.forward_ms, "unavailable": list(self.unavailable),
                "layers": [{"layer": v.layer, "top_token_id": v.top_token_id, "top_text": v.top_text,
                            "top_prob": v.top_prob, "pick_prob": v.pick_prob, "pick_rank": v.pick_rank,
                            "entropy_bits": v.entropy_bits, "ms": v.ms, "attention_ms": v.attention_ms,
                            "mlp_ms": v.mlp_ms, "weight_bytes": v.weight_bytes, "kv_bytes": v.kv_bytes,
                            **({"attention": [list(h) for h in v.attention]} if v.attention is not None else {})}
                           for v in self.layers]}


@dataclass
class Capture:
    """What one instrumented pass kept: small tensors only (no cache tensor is held)."""

    hidden: list[torch.Tensor] = field(default_factory=list)  # [hidden] each: the decoder's input, each layer's output
    attention: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [heads, positions]
    # layer -> (the last query, the keys, the mask, the scaling) as the pass gave them, until the
    # pass ends: the weights are computed then, outside the timed layers
    queries: dict[int, tuple] = field(default_factory=dict)
    kv_bytes: dict[int, int] = field(default_factory=dict)
    marks: list[tuple[str, int, float]] = field(default_factory=list)  # (part, layer, perf_counter)
    forward_ms: float = 0.0
    position: int = 0
    device: torch.device | None = None  # where the pass runs: a GPU is synchronised at every mark


def _now(device: torch.device | None) -> float:
    """perf_counter once the device has done the work queued so far. A GPU runs a layer after
    its hook returns (launches are asynchronous), so an unsynchronised mark would time the
    queueing of the layer, not the layer."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


_capturing = threading.local()  # .capture: the Capture of this thread's pass, if any


# ---- the twin and its attention ---------------------------------------------------------------


def inside_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, *args: object, **kwargs: object) -> tuple:
    """The model's own attention, then the last query's weights over every key it was given
    (computed here only while a capture is on, from tensors the pass already made)."""
    lone = ALL_ATTENTION_FUNCTIONS[module.config.lone_attention_implementation]
    out = lone(module, query, key, value, attention_mask, *args, **kwargs)
    capture: Capture | None = getattr(_capturing, "capture", None)
    if capture is not None:
        capture.queries[module.layer_idx] = (query[:, :, -1:], key, attention_mask, kwargs.get("scaling"))
        capture.kv_bytes[module.layer_idx] = _read_bytes(key, value)
    return out


def _read_bytes(key: torch.Tensor, value: torch.Tensor) -> int:
    """The bytes of the keys and values a layer's query read."""
    return key.numel() * key.element_size() + value.numel() * value.element_size()


def _last_query_weights(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
                        scaling: object) -> torch.Tensor:
    """softmax(q Kᵀ · scaling + mask) for the last query position: `[heads, keys]`, float32."""
    q = query[0, :, -1].float()  # [heads, head_dim]
    k = key[0].float()  # [kv heads, keys, head_dim]
    groups = q.shape[0] // k.shape[0]
    scale = float(scaling) if scaling is not None else 1 / math.sqrt(q.shape[-1])
    # query head h reads KV head h // groups: the heads of a group side by side, no key copied per head
    scores = torch.matmul(q.view(k.shape[0], groups, -1), k.transpose(1, 2)).reshape(q.shape[0], -1) * scale
    if mask is not None:
        row = mask[0, :, -1, : scores.shape[-1]]  # [1 or heads, keys]
        scores = scores.masked_fill(~row, float("-inf")) if row.dtype == torch.bool else scores + row.float()
    return scores.softmax(dim=-1)


def _over_positions(weights: torch.Tensor, width: int) -> torch.Tensor:
    """Weights `[heads, keys]` over the context's positions 0..width-1: a sliding-window layer
    keeps only the latest keys, so the positions before them get weight 0 (as in eager attention)."""
    if weights.shape[-1] < width:
        return torch.nn.functional.pad(weights, (width - weights.shape[-1], 0))
    return weights[..., :width]


TWIN_PATH = "inside view's twin"  # the paths' names in engine/fast/proofs.py's registry
PARTS_PATH = "inside view on the lone pass"


def inside_twin(lm: LoadedModel) -> PreTrainedModel | None:
    """The model's instrumented twin, or None where it cannot be made or its probe pass does not
    give the model's own logits and cache entries (torch.equal) on this machine."""
    return settle(TWIN_PATH, lambda: _probed_twin(lm), owner=lm.model, name=lm.name, per_thread=False).value


def _probed_twin(lm: LoadedModel) -> Verdict:
    model = lm.model
    lone = model.config._attn_implementation
    if lone not in ALL_ATTENTION_FUNCTIONS or lone not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        return refused(f"the model's attention ({lone}) has no function the twin can call")
    AttentionInterface.register(INSIDE_ATTENTION, inside_attention)  # only once a visitor looks inside
    AttentionMaskInterface.register(INSIDE_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[lone])
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    twin = copy.deepcopy(model, memo=shared)  # every tensor shared; modules and config copied
    twin.config._attn_implementation = INSIDE_ATTENTION
    twin.config.lone_attention_implementation = lone
    if _layers(twin) is None:
        return refused("the model's decoder has no list of layers to hook")
    _hook(twin)
    ours, theirs = new_cache(lm), new_cache(lm)
    ids = torch.tensor([list(PROBE_IDS)], device=lm.device)
    with torch.inference_mode():
        expected = model(input_ids=ids, past_key_values=theirs, use_cache=True, logits_to_keep=1).logits
        got = twin(input_ids=ids, past_key_values=ours, use_cache=True, logits_to_keep=1).logits
    if not (torch.equal(expected, got) and same_entries(ours, theirs)):
        return refused("its probe pass differed from the model's in logits or cache entries")
    return proven("probed equal to the model's pass, logits and cache, torch.equal", twin)


def _layers(model: nn.Module) -> Sequence[nn.Module] | None:
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None) or getattr(decoder, "h", None)
    return layers if isinstance(layers, nn.ModuleList) else None


def final_norm(model: nn.Module) -> nn.Module | None:
    """The norm the decoder applies after its last layer (Llama/Gemma `norm`, GPT-2 `ln_f`)."""
    decoder = model.get_decoder()
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        if isinstance(module := getattr(decoder, name, None), nn.Module):
            return module
    return None


def _mark(part: str, layer: int = -1):
    def hook(*_: object) -> None:
        if (capture := getattr(_capturing, "capture", None)) is not None:
            capture.marks.append((part, layer, _now(capture.device)))
    return hook


def _keep_output(module: nn.Module, args: tuple, output: object) -> None:
    if (capture := getattr(_capturing, "capture", None)) is not None:
        hidden = output if isinstance(output, torch.Tensor) else output[0]
        capture.hidden.append(hidden[0, -1].detach().float().clone())  # [hidden]


def _keep_input(module: nn.Module, args: tuple, kwargs: dict) -> None:
    if (capture := getattr(_capturing, "capture", None)) is not None:
        hidden = args[0] if args else kwargs["hidden_states"]
        capture.hidden.append(hidden[0, -1].detach().float().clone())
        capture.marks.append(("layer", 0, _now(capture.device)))


def _hook(twin: PreTrainedModel) -> None:
    """Hooks on the twin's own modules, permanent (the twin is only ever run to look inside)."""
    layers = _layers(twin)
    layers[0].register_forward_pre_hook(_keep_input, with_kwargs=True)
    for index, layer in enumerate(layers, start=1):
        layer.register_forward_hook(_keep_output)
        layer.register_forward_hook(_mark("layer_end", index))
        for name in ("self_attn", "attn", "mlp"):
            if isinstance(part := getattr(layer, name, None), nn.Module):
                kind = "mlp" if name == "mlp" else "attention"
                part.register_forward_pre_hook(_mark(f"{kind}_start", index))
                part.register_forward_hook(_mark(f"{kind}_end", index))
    if (head := twin.get_output_embeddings()) is not None:
        head.register_forward_hook(_mark("head_end"))


# ---- one instrumented pass -------------------------------------------------------------------


def inside_pass(lm: LoadedModel, token_ids: list[int], cache: DynamicCache) -> tuple[torch.Tensor, Capture]:
    """The next-token logits `[vocab]` after reading `token_ids` into `cache` (the model's own
    numbers), and what the pass showed of itself: a decode step through the fast lone pass made
    in parts where that is proven to show what the twin shows, else on the probed twin."""
    twin = inside_twin(lm)
    if twin is None:
        raise SettingsError("inside view", lm.name, "a model whose attention and norms this view can read")
    if len(token_ids) == 1 and plain_filled(cache, lm) and (parts := _proven_parts(lm)) is not None:
        return _pass_in_parts(lm, parts, token_ids[0], cache)
    return _twin_pass(lm, twin, token_ids, cache)


def _twin_pass(lm: LoadedModel, twin: PreTrainedModel, token_ids: list[int], cache: DynamicCache
               ) -> tuple[torch.Tensor, Capture]:
    capture = Capture(position=cache_length(cache) + len(token_ids) - 1, device=lm.device)
    before = cache_length(cache)
    _capturing.capture = capture
    started = _now(lm.device)
    try:
        with torch.inference_mode():
            ids = torch.tensor([token_ids], device=lm.device)
            mask = torch.ones((1, before + len(token_ids)), dtype=torch.long, device=lm.device)
            logits = twin(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True,
                          logits_to_keep=1).logits[0, -1]
        logits = on_cpu(lm, logits)
    except BaseException:
        crop_cache(cache, before)
        raise
    finally:
        _capturing.capture = None
    capture.forward_ms = (time.perf_counter() - started) * 1e3
    capture.marks.insert(0, ("start", -1, started))
    with torch.inference_mode():
        capture.attention = {layer: _over_positions(_last_query_weights(*parts), capture.position + 1)
                             for layer, parts in capture.queries.items()}
    capture.queries = {}  # no reference to the cache's tensors is kept
    return logits, capture


# ---- a decode step in parts, on the fast lone pass ---------------------------------------------

PROBE_STEPS = (7, 3, 11)  # tokens decoded after PROBE_IDS, each way, by the parts' probe


def _pass_in_parts(lm: LoadedModel, parts: tuple[LonePass, LayerParts], token_id: int, cache: DynamicCache
                   ) -> tuple[torch.Tensor, Capture]:
    """A decode step on the fast lone pass, made layer by layer (engine/fast/lone.py): the
    step's own digits at the fast step's speed, and the twin's capture, read from the pass."""
    fast, layer_parts = parts
    position = cache_length(cache)
    started = time.perf_counter()
    with torch.inference_mode():
        seen = fast.step_in_parts(token_id, cache, layer_parts)
        logits = on_cpu(lm, seen.logits)
    capture = Capture(hidden=seen.hidden, kv_bytes={layer: _read_bytes(*kv) for layer, kv in enumerate(seen.read)},
                      marks=[("start", -1, started), *seen.marks], position=position,
                      forward_ms=(time.perf_counter() - started) * 1e3)
    with torch.inference_mode():
        capture.attention = {layer: _over_positions(_last_query_weights(query, keys, None, fast.weights.scale),
                                                    position + 1)
                             for layer, (query, (keys, _)) in enumerate(zip(seen.queries, seen.read, strict=True))}
    return logits, capture


def _proven_parts(lm: LoadedModel) -> tuple[LonePass, LayerParts] | None:
    """The fast pass and its compiled parts, where a probe at this thread count showed them
    giving the twin's logits, cache entries, states and attention weights (torch.equal)."""
    def guarded() -> Verdict:
        try:
            return _probed_parts(lm)
        except Exception as error:  # whatever went wrong, the twin still shows the pass
            return refused(f"its probe failed ({type(error).__name__})", warn=True)

    return settle(PARTS_PATH, guarded, owner=lm.model, name=lm.name).value


def _probed_parts(lm: LoadedModel) -> Verdict:
    fast, layer_parts = lone_pass(lm, eager_step), compiled_layer_parts()
    twin = inside_twin(lm)
    if fast is None:
        return refused("the fast lone pass is not in use")
    if layer_parts is None:
        return refused("TorchScript could not compile the pass's parts")
    if twin is None:
        return refused("the twin is not in use")
    vocab = lm.vocab_size
    ours, theirs = new_cache(lm), new_cache(lm)
    with torch.inference_mode():
        for cache in (ours, theirs):
            eager_step(lm, [t % vocab for t in PROBE_IDS], cache)
    for token in (t % vocab for t in PROBE_STEPS):
        expected_logits, expected = _twin_pass(lm, twin, [token], theirs)
        got_logits, got = _pass_in_parts(lm, (fast, layer_parts), token, ours)
        same = (torch.equal(expected_logits, got_logits) and len(expected.hidden) == len(got.hidden)
                and all(torch.equal(a, b) for a, b in zip(expected.hidden, got.hidden, strict=True))
                and expected.attention.keys() == got.attention.keys()
                and all(torch.equal(expected.attention[k], got.attention[k]) for k in expected.attention)
                and expected.kv_bytes == got.kv_bytes)
        if not same:
            return refused("its probe differed from the twin in logits, states, attention or bytes read")
    if not same_entries(ours, theirs):
        return refused("its probe differed from the twin in cache entries")
    return proven("probed equal to the twin: logits, cache entries, states and attention weights, torch.equal",
                  (fast, layer_parts))


# ---- the view, for a step and its pick -------------------------------------------------------


def prepare_inside(lm: LoadedModel) -> None:
    """Builds (or loads from the cache folder) the lens kernel now, at the server's start, so the
    first visitor to open the view does not wait the build's twenty-odd seconds."""
    if lm.device.type == "cpu" and lm.dtype == torch.float32:
        lens_kernel_usable()


def inside_view(lm: LoadedModel, capture: Capture, logits: torch.Tensor, pick: int, step: int) -> InsideView:
    """The per-layer view of one captured pass; `logits` `[vocab]`: the step's own (the last
    layer's lens), `pick`: the step's token."""
    unavailable = []
    norm, head = final_norm(lm.model), plain_head(lm)
    lens = None
    if norm is None:
        unavailable.append(f"logit lens: {type(lm.model).__name__} has no final norm this view can find")
    elif head is None:
        unavailable.append("logit lens: the model reshapes its logits after the LM head (soft-capping or scaling)")
    else:
        with torch.inference_mode():
            hidden = torch.stack(capture.hidden[:-1]).to(lm.device, lm.dtype)  # [layers, hidden]; the last: the step's
            normed = norm(hidden.unsqueeze(0))[0]  # each row with its own statistics
            # [layers, vocab], one pass over the head for every row; rows contiguous, so each softmax reads one run
            rows = on_cpu(lm, lens_linear(normed, head.weight, head.bias))
            lens = [*_lens_stats(rows, pick), _own_stats(logits, pick)]  # the last: the step's own
    attention_missing = not capture.attention
    if attention_missing:
        unavailable.append(f"attention: {lm.model.config._attn_implementation} attention gives no weights here")
    times = _times(capture)
    views = []
    count = len(capture.hidden)
    sizes = _weight_bytes(lm)
    for index in range(count):
        stats = lens[index] if lens is not None else None
        weights = capture.attention.get(index - 1) if index else None
        views.append(_layer_view(lm, index, stats, times, weights, sizes[index], capture))
    kv_heads = lm.geometry.kv_heads
    heads = next(iter(capture.attention.values())).shape[0] if capture.attention else kv_heads
    group = max(1, heads // max(1, kv_heads))
    return InsideView(step=step, position=capture.position, hidden_size=int(capture.hidden[0].numel()),
                      layers=tuple(views),
                      first_lead=_first_lead(views, pick) if lens is not None else None,
                      kv_head_of=tuple(h // group for h in range(heads)), head_ms=times.get(("head", -1), 0.0),
                      head_bytes=sizes[-1],
                      forward_ms=capture.forward_ms, unavailable=tuple(unavailable))


def _lens_stats(rows: torch.Tensor, pick: int) -> list[tuple[int, float, float, int, float]]:
    """Per lens row `[layers, vocab]`: (top token, its p, the pick's p, the pick's rank, entropy
    in bits), every row at once: by the lens kernel where it serves, else by torch."""
    rows = rows.float()
    if (fast := lens_statistics(rows, pick)) is not None:
        return fast
    probs = rows.softmax(dim=-1)
    top_probs, tops = probs.max(dim=-1)  # the first of equal maxima, as argmax
    ranks = (rows > rows[:, pick : pick + 1]).sum(dim=-1) + 1
    # H = -Σ p log p, with log p = z - log Σ e^z and log Σ e^z = z_top - log p_top: the softmax's
    # exponentials serve both (a log-softmax would take them again); 0 · log 0 counts 0
    log_total = rows.gather(1, tops[:, None]) - top_probs[:, None].log()
    entropies = -(probs * (rows - log_total)).nansum(dim=-1).double() / math.log(2)
    return list(zip(tops.tolist(), top_probs.tolist(), probs[:, pick].tolist(), ranks.tolist(), entropies.tolist(),
                    strict=True))


def _own_stats(logits: torch.Tensor, pick: int) -> tuple[int, float, float, int, float]:
    """The last layer's lens: the step's own distribution, with the step's own entropy."""
    logits = logits.float()
    probs = logits.softmax(dim=-1)  # as the step computes its own
    top_prob, top = probs.max(dim=-1)
    rank = int((logits > logits[pick]).sum()) + 1
    return int(top), float(top_prob), float(probs[pick]), rank, entropy_bits(probs)


_sizes: weakref.WeakKeyDictionary[PreTrainedModel, list[int]] = weakref.WeakKeyDictionary()


def _weight_bytes(lm: LoadedModel) -> list[int]:
    """Bytes of the embeddings, of each decoder layer, and of the LM head (counted once per model)."""
    if lm.model not in _sizes:
        modules = [lm.model.get_input_embeddings(), *_layers(lm.model), lm.model.get_output_embeddings()]
        _sizes[lm.model] = [sum(p.numel() * p.element_size() for p in m.parameters()) for m in modules]
    return _sizes[lm.model]


def _layer_view(lm: LoadedModel, index: int, stats: tuple | None, times: dict, weights: torch.Tensor | None,
                weight_bytes: int, capture: Capture) -> LayerView:
    if stats is not None:
        top, top_prob, pick_prob, pick_rank, entropy = stats
        top_text = lm.texts.piece(top).text
    else:
        top, top_text, top_prob, pick_prob, pick_rank, entropy = -1, "", math.nan, math.nan, 0, math.nan
    return LayerView(
        layer=index, top_token_id=top, top_text=top_text, top_prob=top_prob, pick_prob=pick_prob,
        pick_rank=pick_rank, entropy_bits=entropy,
        attention_ms=times.get(("attention", index)) if index else None,
        mlp_ms=times.get(("mlp", index)) if index else None, ms=times.get(("layer", index), 0.0),
        weight_bytes=weight_bytes, kv_bytes=capture.kv_bytes.get(index - 1, 0) if index else 0,
        attention=tuple(tuple(h) for h in weights.tolist()) if weights is not None else None)


def _times(capture: Capture) -> dict[tuple[str, int], float]:
    """Milliseconds per (part, layer) from the marks: each part from its start to its end; a
    layer from the previous layer's end (the embeddings: from the pass's start to layer 1)."""
    times: dict[tuple[str, int], float] = {}
    starts: dict[tuple[str, int], float] = {}
    previous = None
    for part, layer, at in capture.marks:
        if part == "start":
            previous = at
        elif part == "layer" and previous is not None:  # the embeddings end where layer 1 begins
            times[("layer", 0)] = (at - previous) * 1e3
            previous = at
        elif part.endswith("_start"):
            starts[(part[:-6], layer)] = at
        elif part == "layer_end" and previous is not None:
            times[("layer", layer)] = (at - previous) * 1e3
            previous = at
        elif part == "head_end" and previous is not None:
            times[("head", -1)] = (at - previous) * 1e3
        elif part.endswith("_end") and (begun := starts.get((part[:-4], layer))) is not None:
            times[(part[:-4], layer)] = (at - begun) * 1e3
    return times


def _first_lead(views: Sequence[LayerView], pick: int) -> int | None:
    """The first layer from which on the pick stays the lens's top token."""
    lead = None
    for view in views:
        lead = (view.layer if lead is None else lead) if view.top_token_id == pick else None
    return lead
