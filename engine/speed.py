"""Measure what a decode step costs on the device the model runs on.

Every function here runs the real model (or the device) and returns a small frozen record;
nothing is estimated from a spec sheet. The KV sizes of other well-known models are the one
exception: they come from those models' published configs and are labelled with the source.

Timings are the fastest of a few repeats, taken after one untimed warm-up pass, with the
device synchronised around each timed call so asynchronous GPUs report real durations. Other
work on the machine can only slow a run down, so the fastest repeat is the closest to what the
hardware does (the reason `timeit` recommends the minimum too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from transformers import DynamicCache

from engine.errors import SettingsError
from engine.fast import weight_products
from engine.forward import crop_cache, forward, forward_one, lone_pass_decision, new_cache
from engine.kvcache import KVGeometry, KVSnapshot, read_kv
from engine.loading import LoadedModel

# Ordinary English, in our own words: measurements run on real text, not random ids, so the
# attention pattern is a realistic one. Longer contexts repeat it.
SAMPLE_TEXT = (
    "A language model writes one token at a time. At every step it reads the whole context, "
    "scores every token in its vocabulary, turns the scores into probabilities and picks one. "
    "The new token joins the context and the loop goes round again, until the model ends its "
    "turn, a stop sequence appears, or the caller's limit on new tokens is reached. "
)


# ---- records ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CachePoint:
    """One context length: a decode step with the KV cache against recomputing everything."""

    context_tokens: int  # tokens in the context when the next token's logits are computed
    cached_ms: float  # one forward pass of the newest token, reading the cache
    recompute_ms: float  # one forward pass over the whole context, no cache

    @property
    def ratio(self) -> float:
        """How many times slower recomputing is."""
        return self.recompute_ms / self.cached_ms


@dataclass(frozen=True)
class PrefillDecode:
    """The prompt in one pass against one token per pass."""

    prompt_tokens: int
    prefill_ms: float  # the whole prompt, one forward pass
    decode_steps: int
    decode_ms: float  # fastest decode step (one new token)

    @property
    def prefill_ms_per_token(self) -> float:
        return self.prefill_ms / self.prompt_tokens

    @property
    def ratio(self) -> float:
        """How many times more a token costs in decode than in prefill."""
        return self.decode_ms / self.prefill_ms_per_token


@dataclass(frozen=True)
class KVConfig:
    """A model's KV-cache shape, from its published config."""

    name: str
    layers: int  # num_hidden_layers
    kv_heads: int  # num_key_value_heads (equal to the attention heads without GQA)
    head_dim: int  # hidden_size / num_attention_heads unless the config says otherwise
    dtype: str  # the config's torch_dtype: what the weights and the cache are stored in
    bytes_per_value: int
    source: str  # where the figures come from

    @property
    def bytes_per_position(self) -> int:
        """K and V, every layer, every KV head, for one token (the engine's one formula)."""
        return KVGeometry(self.layers, self.kv_heads, self.head_dim).bytes_for(1, self.bytes_per_value)

    def bytes_for(self, positions: int) -> int:
        return self.bytes_per_position * positions


# Checked against each model's config.json on the Hugging Face Hub.
KNOWN_CONFIGS: tuple[KVConfig, ...] = (
    KVConfig("GPT-2 small", 12, 12, 64, "float32", 4,
             "openai-community/gpt2 config.json: n_layer 12, n_head 12, n_embd 768 (float32 weights)"),
    KVConfig("Llama-2-7B", 32, 32, 128, "float16", 2,
             "meta-llama/Llama-2-7b-hf config.json: 32 layers, 32 heads, 32 KV heads, hidden 4096, float16"),
    KVConfig("Llama-3-8B", 32, 8, 128, "bfloat16", 2,
             "meta-llama/Meta-Llama-3-8B config.json: 32 layers, 32 heads, 8 KV heads, hidden 4096, bfloat16"),
    KVConfig("Mistral-7B", 32, 8, 128, "bfloat16", 2,
             "mistralai/Mistral-7B-v0.1 config.json: 32 layers, 32 heads, 8 KV heads, hidden 4096, bfloat16"),
    KVConfig("Qwen2.5-7B", 28, 4, 128, "bfloat16", 2,
             "Qwen/Qwen2.5-7B config.json: 28 layers, 28 heads, 4 KV heads, hidden 3584, bfloat16"),
)


@dataclass(frozen=True)
class DeviceSpeed:
    """What the device sustains, measured: a square matmul and a large copy."""

    device: str
    dtype: str  # the matmul's number format
    matmul_size: int  # n for an n x n by n x n product
    flops_per_s: float
    copy_bytes: int  # bytes read plus bytes written by one copy
    bytes_per_s: float

    @property
    def ridge_flops_per_byte(self) -> float:
        """Compute-to-bandwidth ratio: work below this many FLOPs per byte waits on memory."""
        return self.flops_per_s / self.bytes_per_s


@dataclass(frozen=True)
class DecodeIntensity:
    """One decode step's work against the bytes it must read, and how fast it really ran."""

    context_tokens: int
    flops: float  # 2 per parameter (multiply + add) plus attention over the context
    weight_bytes: int  # every weight tensor, read once per step
    kv_bytes: int  # the cache read by attention, measured from its tensors
    step_ms: float  # measured

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def flops_per_byte(self) -> float:
        return self.flops / self.bytes

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.bytes / (self.step_ms / 1e3)

    @property
    def achieved_flops_per_s(self) -> float:
        return self.flops / (self.step_ms / 1e3)


@dataclass(frozen=True)
class DecodeReads:
    """How fast a decode step reads the weights, measured the way it reads them, and where the
    rest of its time goes (every figure measured, none taken from a spec sheet)."""

    path: str  # which pass a lone decode step takes on this server
    reason: str  # why: the probe's verdict
    read_bytes: int  # the plain read: bytes summed
    read_ms: float  # a plain read of a large buffer (torch.sum): memory's own read speed
    products_bytes: int  # every weight the step multiplies by
    product_calls: int  # the separate products (calls) the step reads them in
    products_ms: float  # one row through each of them, as the step makes its products, and nothing else
    attention_ms: float  # attention over the cache in every layer, alone
    step: DecodeIntensity  # the whole step

    @property
    def read_bytes_per_s(self) -> float:
        return self.read_bytes / (self.read_ms / 1e3)

    @property
    def products_bytes_per_s(self) -> float:
        return self.products_bytes / (self.products_ms / 1e3)

    @property
    def achieved_fraction(self) -> float:
        """The whole step's bytes per second as a share of the plain read's."""
        return self.step.achieved_bytes_per_s / self.read_bytes_per_s

    @property
    def other_ms(self) -> float:
        """The step's time outside its products and attention: norms, rotary embedding, the MLP's
        activation, the residual adds, and the calls between them."""
        return max(0.0, self.step.step_ms - self.products_ms - self.attention_ms)

    @property
    def parts_add_up(self) -> bool:
        """Whether the parts, each timed on its own, fit inside the whole step as timed: on a busy
        machine the step's best run can beat its products' best run, and then `other_ms` is no
        measurement (it shows 0)."""
        return self.products_ms + self.attention_ms <= self.step.step_ms


@dataclass(frozen=True)
class BatchPoint:
    """Several sequences decoded together, one new token each, in one forward pass."""

    batch: int
    context_tokens: int  # per sequence
    step_ms: float  # fastest batched decode step

    @property
    def per_token_ms(self) -> float:
        return self.step_ms / self.batch

    @property
    def tokens_per_s(self) -> float:
        return self.batch / (self.step_ms / 1e3)


@dataclass(frozen=True)
class Sizes:
    """How much each measurement runs."""

    cache_lengths: tuple[int, ...]  # context lengths for cache vs recompute
    prompt_tokens: int  # prefill length, and the context of the intensity step
    decode_steps: int
    batch_context: int  # tokens per sequence when batching
    repeats: int  # timed repeats per figure (after one warm-up)

    def fitted(self, context_window: int) -> Sizes:
        """The same sizes, with every context kept inside a model's context window."""
        most = context_window - 1
        lengths = tuple(n for n in self.cache_lengths if n <= most) or (min(most, self.cache_lengths[0]),)
        return replace(self, cache_lengths=lengths, prompt_tokens=min(self.prompt_tokens, most),
                       batch_context=min(self.batch_context, most))


# Small enough for a first visit to finish in seconds on 2 CPU cores; "more" for a closer look.
QUICK = Sizes(cache_lengths=(16, 64, 128, 256), prompt_tokens=64, decode_steps=6, batch_context=16, repeats=2)
MORE = Sizes(cache_lengths=(16, 64, 128, 256, 512, 1024), prompt_tokens=256, decode_steps=16, batch_context=64,
             repeats=3)


# ---- the forward passes measured ----------------------------------------------------------

def sample_context(lm: LoadedModel, length: int, offset: int = 0) -> list[int]:
    """`length` token ids of ordinary text (starting `offset` tokens in), repeated as needed."""
    if not 1 <= length < lm.context_window:
        raise SettingsError("context length", length, f"a whole number from 1 to {lm.context_window - 1}")
    base = lm.tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    return [base[(offset + i) % len(base)] for i in range(length)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prefill(lm: LoadedModel, sequences: Sequence[Sequence[int]]) -> tuple[DynamicCache, torch.Tensor]:
    """Read equal-length sequences in one pass into a fresh cache; logits `[batch, vocab]`."""
    cache = new_cache(lm)
    return cache, forward(lm, torch.tensor([list(s) for s in sequences]), cache)


def decode(lm: LoadedModel, cache: DynamicCache, next_ids: Sequence[int]) -> torch.Tensor:
    """One decode step: one new token per sequence, reading the cache; logits `[batch, vocab]`."""
    return forward(lm, torch.tensor([[i] for i in next_ids]), cache)


def next_logits_cached(lm: LoadedModel, context: Sequence[int]) -> torch.Tensor:
    """The next token's logits `[vocab]` as generation computes them: the context minus its
    last token is in the cache, and the last token is one decode step."""
    return batch_step_logits(lm, [context])[0]


def next_logits_recomputed(lm: LoadedModel, context: Sequence[int]) -> torch.Tensor:
    """The same logits `[vocab]` without a cache: the whole context in one pass."""
    return forward_one(lm, list(context), None)


def batch_step_logits(lm: LoadedModel, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """Prefill every sequence but its last token, then decode the last tokens together;
    logits `[batch, vocab]`. Sequences must be of equal length (no padding here)."""
    if len({len(s) for s in sequences}) != 1 or len(sequences[0]) < 2:
        raise SettingsError("sequences", [len(s) for s in sequences], "equal lengths of at least 2 tokens")
    cache, _ = prefill(lm, [s[:-1] for s in sequences])
    return decode(lm, cache, [s[-1] for s in sequences])


# ---- timing -------------------------------------------------------------------------------

def _time_ms(run: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call, with the device synchronised on both sides."""
    _sync(device)
    started = time.perf_counter()
    run()
    _sync(device)
    return (time.perf_counter() - started) * 1e3


def _best_ms(run: Callable[[], object], device: torch.device, repeats: int,
             reset: Callable[[], object] | None = None) -> float:
    """Fastest wall time of `run` over `repeats` timed calls, after one untimed warm-up.
    `reset` (untimed) runs after every call, e.g. to crop a cache back."""
    times = []
    for attempt in range(repeats + 1):
        elapsed = _time_ms(run, device)
        if attempt:  # the first call warms caches and allocators
            times.append(elapsed)
        if reset is not None:
            reset()
    return min(times)


def _require_repeats(repeats: int) -> None:
    if not isinstance(repeats, int) or repeats < 1:
        raise SettingsError("repeats", repeats, "a whole number >= 1")


def measure_cache_vs_recompute(lm: LoadedModel, context_lengths: Sequence[int], repeats: int = 3
                               ) -> tuple[CachePoint, ...]:
    """At each context length, time one decode step with the cache and the same logits
    recomputed from the whole context without it."""
    _require_repeats(repeats)
    return tuple(_cache_point(lm, length, repeats) for length in context_lengths)


def _cache_point(lm: LoadedModel, length: int, repeats: int) -> CachePoint:
    if not isinstance(length, int) or length < 2:
        raise SettingsError("context length", length, "a whole number >= 2")
    context = sample_context(lm, length)
    cache, _ = prefill(lm, [context[:-1]])
    cached, recomputed = [], []
    # alternate the two, after one warm-up of each, so a burst of other work on the
    # machine slows both rather than skewing their ratio
    for attempt in range(repeats + 1):
        cached_ms = _time_ms(lambda: decode(lm, cache, [context[-1]]), lm.device)
        crop_cache(cache, length - 1)
        recompute_ms = _time_ms(lambda: next_logits_recomputed(lm, context), lm.device)
        if attempt:
            cached.append(cached_ms)
            recomputed.append(recompute_ms)
    return CachePoint(length, min(cached), min(recomputed))


def measure_prefill_decode(lm: LoadedModel, prompt_tokens: int = 64, decode_steps: int = 8,
                           repeats: int = 3) -> PrefillDecode:
    """Time the prompt read in one pass, then greedy decode steps one token at a time."""
    _require_repeats(repeats)
    if not isinstance(decode_steps, int) or decode_steps < 1:
        raise SettingsError("decode_steps", decode_steps, "a whole number >= 1")
    prompt = sample_context(lm, prompt_tokens)
    prefill_ms = _best_ms(lambda: prefill(lm, [prompt]), lm.device, repeats)
    cache, logits = prefill(lm, [prompt])
    step_times = []
    for _ in range(decode_steps):
        next_id = int(logits[0].argmax())
        _sync(lm.device)
        started = time.perf_counter()
        logits = decode(lm, cache, [next_id])
        _sync(lm.device)
        step_times.append((time.perf_counter() - started) * 1e3)
    return PrefillDecode(prompt_tokens, prefill_ms, decode_steps, min(step_times))


@dataclass(frozen=True)
class PrefillCost:
    """What reading a prompt in one pass costs on this machine, from two measured lengths: the
    linear part (every token through the weights) and the quadratic part (every token attending
    to every earlier one), t(n) = per_token_ms * n + per_pair_ms * n^2. Reading 1,500 tokens
    costs more than three times 500: a straight line through one short prompt would promise a
    long one too soon."""

    lengths: tuple[int, int]
    measured_ms: tuple[float, float]
    per_token_ms: float
    per_pair_ms: float  # >= 0

    def estimate_s(self, tokens: int) -> float:
        """Seconds to read `tokens` in one pass on an otherwise idle machine."""
        return (self.per_token_ms * tokens + self.per_pair_ms * tokens * tokens) / 1e3


def fit_prefill_cost(lengths: tuple[int, int], measured_ms: tuple[float, float]) -> PrefillCost:
    """The two-term cost through two (length, time) points; a quadratic part that timing noise
    makes negative is taken as zero (the line through the longer point)."""
    (n1, n2), (t1, t2) = lengths, measured_ms
    if not 0 < n1 < n2:
        raise SettingsError("prefill lengths", lengths, "two whole numbers, the first smaller, both above 0")
    per_pair = (t2 / n2 - t1 / n1) / (n2 - n1)
    if per_pair <= 0:
        return PrefillCost(lengths, measured_ms, t2 / n2, 0.0)
    return PrefillCost(lengths, measured_ms, t1 / n1 - per_pair * n1, per_pair)


def measure_prefill_cost(lm: LoadedModel, lengths: tuple[int, int] = (128, 512), repeats: int = 1) -> PrefillCost:
    """Time a prompt read in one pass at two lengths (the fastest of `repeats` each, after a
    warm-up) and fit `PrefillCost` through them."""
    _require_repeats(repeats)
    times = tuple(_best_ms(lambda n=n: prefill(lm, [sample_context(lm, n)]), lm.device, repeats) for n in lengths)
    return fit_prefill_cost(lengths, times)


def measure_kv(lm: LoadedModel, positions: int) -> KVSnapshot:
    """Fill a real cache with `positions` tokens and read its tensors."""
    cache, _ = prefill(lm, [sample_context(lm, positions)])
    return read_kv(cache, lm.geometry, lm.dtype)


def loaded_kv_config(lm: LoadedModel) -> KVConfig:
    """The loaded model's KV shape, in the same form as the published ones."""
    per_value = torch.empty((), dtype=lm.dtype).element_size()
    geometry = lm.geometry
    return KVConfig(lm.name, geometry.layers, geometry.kv_heads, geometry.head_dim,
                    str(lm.dtype).removeprefix("torch."), per_value, "the loaded model's own config")


def measure_device(device: torch.device, dtype: torch.dtype = torch.float32, matmul_size: int | None = None,
                   copy_mib: int | None = None, repeats: int = 3) -> DeviceSpeed:
    """Sustained compute (an n x n matmul in `dtype`, the model's own) and memory bandwidth
    (a copy of `copy_mib` MiB, counted as the bytes read plus the bytes written).

    The default sizes are big enough to keep the device busy: larger on a GPU."""
    _require_repeats(repeats)
    gpu = device.type == "cuda"
    n = matmul_size or (8192 if gpu else 1024)
    mib = copy_mib or (2048 if gpu else 256)
    a = torch.full((n, n), 0.5, device=device, dtype=dtype)
    b = torch.full((n, n), 0.25, device=device, dtype=dtype)
    matmul_ms = _best_ms(lambda: a @ b, device, repeats)
    source = torch.zeros(mib * 2**20 // a.element_size(), device=device, dtype=dtype)
    target = torch.empty_like(source)
    copy_ms = _best_ms(lambda: target.copy_(source), device, repeats)
    moved = 2 * source.numel() * source.element_size()
    return DeviceSpeed(device=str(device), dtype=str(dtype).removeprefix("torch."), matmul_size=n,
                       flops_per_s=2 * n**3 / (matmul_ms / 1e3), copy_bytes=moved,
                       bytes_per_s=moved / (copy_ms / 1e3))


def weight_bytes(lm: LoadedModel) -> int:
    """Bytes of every weight tensor (shared tensors, like tied embeddings, counted once)."""
    return sum(p.numel() * p.element_size() for p in lm.model.parameters())


def linear_weight_bytes(lm: LoadedModel) -> int:
    """Bytes of every linear layer's weight, each tensor once (a tied head is the embedding):
    what a decode step's products read."""
    linears = {id(m.weight): m.weight for m in lm.model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(w.numel() * w.element_size() for w in linears.values())


def decode_flops(lm: LoadedModel, context_tokens: int) -> float:
    """FLOPs of one decode step: a multiply and an add per parameter, plus attention's two
    products (scores and weighted values) over the context in every layer."""
    config = lm.model.config.get_text_config()
    attention = 2 * 2 * lm.geometry.layers * config.num_attention_heads * lm.geometry.head_dim * context_tokens
    return 2.0 * lm.parameters + attention


def measure_decode_intensity(lm: LoadedModel, context_tokens: int = 64, repeats: int = 5) -> DecodeIntensity:
    """Time one decode step at `context_tokens` and set its FLOPs against its bytes."""
    _require_repeats(repeats)
    context = sample_context(lm, context_tokens)
    cache, _ = prefill(lm, [context[:-1]])
    step_ms = _best_ms(lambda: decode(lm, cache, [context[-1]]), lm.device, repeats,
                         reset=lambda: crop_cache(cache, context_tokens - 1))
    decode(lm, cache, [context[-1]])  # once more, untimed, to measure the cache the step reads
    kv = read_kv(cache, lm.geometry, lm.dtype)  # context_tokens positions
    return DecodeIntensity(context_tokens, decode_flops(lm, context_tokens), weight_bytes(lm), kv.bytes, step_ms)


def measure_decode_reads(lm: LoadedModel, step: DecodeIntensity, repeats: int = 5, read_mib: int | None = None
                         ) -> DecodeReads:
    """Set a measured decode step (`measure_decode_intensity`) against the bandwidth it could
    have: a plain read of `read_mib` MiB, and the step's own products alone (one row through
    every weight, by the pass this server's lone steps take); and time attention over a cache of
    the step's length in every layer, alone."""
    _require_repeats(repeats)
    decision = lone_pass_decision(lm)
    mib = read_mib or (2048 if lm.device.type == "cuda" else 256)
    buffer = torch.ones(mib * 2**20 // 4, device=lm.device)
    read_ms = _best_ms(buffer.sum, lm.device, repeats)
    del buffer
    products_bytes = linear_weight_bytes(lm)
    products, calls = weight_products(lm, decision.fast)
    products_ms = _best_ms(products, lm.device, repeats)
    return DecodeReads(decision.path, decision.reason, mib * 2**20, read_ms, products_bytes, calls, products_ms,
                       _attention_ms(lm, step.context_tokens, repeats), step)


def _attention_ms(lm: LoadedModel, context_tokens: int, repeats: int) -> float:
    """One new query's attention over `context_tokens` keys and values, in every layer, alone."""
    geometry, config = lm.geometry, lm.model.config.get_text_config()
    heads = config.num_attention_heads
    keys = torch.randn((1, geometry.kv_heads, context_tokens, geometry.head_dim), dtype=lm.dtype, device=lm.device)
    query = torch.randn((1, heads, 1, geometry.head_dim), dtype=lm.dtype, device=lm.device)
    grouped = heads != geometry.kv_heads

    def attention() -> None:
        for _ in range(geometry.layers):
            torch.nn.functional.scaled_dot_product_attention(query, keys, keys, enable_gqa=grouped)

    return _best_ms(attention, lm.device, repeats)


def measure_batching(lm: LoadedModel, batch_sizes: Sequence[int] = (1, 4, 16), context_tokens: int = 32,
                     repeats: int = 3) -> tuple[BatchPoint, ...]:
    """Time one decode step for several sequences at once (each a different stretch of
    text, all the same length), for each batch size."""
    _require_repeats(repeats)
    return tuple(_batch_point(lm, batch, context_tokens, repeats) for batch in batch_sizes)


def _batch_point(lm: LoadedModel, batch: int, context_tokens: int, repeats: int) -> BatchPoint:
    if not isinstance(batch, int) or batch < 1:
        raise SettingsError("batch size", batch, "a whole number >= 1")
    sequences = [sample_context(lm, context_tokens, offset=7 * row) for row in range(batch)]
    cache, _ = prefill(lm, [s[:-1] for s in sequences])
    last = [s[-1] for s in sequences]
    step_ms = _best_ms(lambda: decode(lm, cache, last), lm.device, repeats,
                         reset=lambda: crop_cache(cache, context_tokens - 1))
    return BatchPoint(batch, context_tokens, step_ms)
