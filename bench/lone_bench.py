"""A lone visitor's decode step, part by part: where its time goes, against memory's own speed.

    .venv/bin/python -m bench.lone_bench [--context 64] [--steps 40] [--threads 2] [--profile]

Measures, on this machine and in one run (the real bundled model, `--threads` torch threads):
  - the whole decode step through the fast lone pass (engine/fast/lone.py) and through
    transformers' eager pass, interleaved, median of `--steps` each, every pair's logits checked
    equal (torch.equal);
  - each part of the fast step on its own, every layer's worth in one TorchScript call (so no
    Python overhead is counted where the step has none): the products by kind (query, key and
    value in one call; the output projection; gate and up in one call; down; the 49,152 x 576
    head), the RMS norms, the rotary embedding, attention over the cache with its growth, the
    MLP's activation and the residual adds; and the Python around the call (embedding, cos and
    sin, handing the grown cache back). What the parts leave of the whole step is the
    interpreter's own time between ops;
  - memory's read speed (torch.sum over 512 MiB) and the products' bandwidth against it;
  - the process's peak resident memory (the fast pass reads the model's own weight tensors: no copy);
  - with `--profile`, the fast steps back to back under torch's profiler: each op's time inside
    the real step, grouped (the products, the cache's growth and rotate_half's concatenations,
    attention, the rest), against the step's time without the profiler. The parts above are
    timed alone; this says what they cost in place.
Writes bench/results/lone.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from engine import load_model
from engine.fast import LAYER_WEIGHTS, keep_grown, llama_weights, lone_rows_linear, rms_norm, room_to_grow, rotate_half
from engine.forward import eager_step, forward_one, lone_pass_decision, new_cache
from engine.speed import linear_weight_bytes, sample_context

RESULTS = Path(__file__).parent / "results"


# Each part returns what it made: TorchScript would drop an op whose result is never used.
def qkv_products(x: Tensor, weights: list[Tensor]) -> list[Tensor]:
    out: list[Tensor] = []
    for layer in range(len(weights) // 9):
        out += torch.ops.token_by_token.lone_rows_linears(x, [weights[layer * 9 + 1], weights[layer * 9 + 2],
                                                              weights[layer * 9 + 3]])
    return out


def o_products(x: Tensor, weights: list[Tensor]) -> list[Tensor]:
    return [torch.ops.token_by_token.lone_rows_linear(x, weights[layer * 9 + 4]) for layer in range(len(weights) // 9)]


def gate_up_products(x: Tensor, weights: list[Tensor]) -> list[Tensor]:
    out: list[Tensor] = []
    for layer in range(len(weights) // 9):
        out += torch.ops.token_by_token.lone_rows_linears(x, [weights[layer * 9 + 6], weights[layer * 9 + 7]])
    return out


def down_products(x: Tensor, weights: list[Tensor]) -> list[Tensor]:
    return [torch.ops.token_by_token.lone_rows_linear(x, weights[layer * 9 + 8]) for layer in range(len(weights) // 9)]


def norms(x: Tensor, weights: list[Tensor], eps: float) -> list[Tensor]:
    out: list[Tensor] = []
    for layer in range(len(weights) // 9):
        out.append(rms_norm(x, weights[layer * 9], eps))
        out.append(rms_norm(x, weights[layer * 9 + 5], eps))
    out.append(rms_norm(x, weights[0], eps))  # the final norm
    return out


def rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, layers: int) -> list[Tensor]:
    out: list[Tensor] = []
    for _ in range(layers):
        out.append((q * cos) + (rotate_half(q) * sin))
        out.append((k * cos) + (rotate_half(k) * sin))
    return out


def attention(q: Tensor, k: Tensor, keys: list[Tensor], values: list[Tensor], scale: float, gqa: bool
              ) -> list[Tensor]:
    out: list[Tensor] = []
    for layer in range(len(keys)):
        grown_k = torch.cat([keys[layer], k], dim=-2)
        grown_v = torch.cat([values[layer], k], dim=-2)
        out.append(F.scaled_dot_product_attention(q, grown_k, grown_v, attn_mask=None, dropout_p=0.0,
                                                  is_causal=False, scale=scale, enable_gqa=gqa))
        out += [grown_k, grown_v]
    return out


def mlp_and_residuals(hidden: Tensor, attended: Tensor, gate: Tensor, up: Tensor, layers: int) -> list[Tensor]:
    out: list[Tensor] = []
    for _ in range(layers):
        flat = attended.transpose(1, 2).contiguous().reshape(1, 1, -1).contiguous()
        mid = hidden + flat
        out.append(F.silu(gate) * up)
        out.append(mid + flat)
    return out


def median_ms(run: Callable[[], object], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def read_bandwidth(mib: int = 512, repeats: int = 10) -> float:
    buffer = torch.ones(mib * 2**20 // 4)
    return buffer.numel() * 4 / (median_ms(buffer.sum, repeats) / 1e3)


def whole_steps(lm, context: list[int], steps: int) -> tuple[list[float], list[float]]:
    """Fast and eager steps side by side on two caches of the same context, alternating."""
    ours, theirs = new_cache(lm), new_cache(lm)
    eager_step(lm, context, ours)
    token = int(eager_step(lm, context, theirs)[0].argmax())
    fast_ms, eager_ms = [], []
    for _ in range(steps):
        started = time.perf_counter()
        logits = forward_one(lm, [token], ours)
        fast_ms.append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        reference = eager_step(lm, [token], theirs)[0]
        eager_ms.append((time.perf_counter() - started) * 1e3)
        assert torch.equal(logits, reference)
        token = int(logits.argmax())
    return fast_ms, eager_ms


# in-place op groups (--profile): an op's name -> the group its time is counted in
OP_GROUPS = (("token_by_token::", "products (the exact rows kernel)"),
             ("aten::cat", "concatenations (the cache's growth, rotate_half)"),
             ("attention", "attention over the cache"))


def in_place_ms(lm, context: list[int], steps: int) -> tuple[float, dict[str, float]]:
    """The fast step's median back to back without the profiler, then each op group's
    self time per step under it (ops outside every group: "the other ops")."""
    cache = new_cache(lm)
    eager_step(lm, context, cache)
    step_ms = median_ms(lambda: forward_one(lm, [5], cache), steps)
    profiled = max(5, steps // 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(profiled):
            forward_one(lm, [5], cache)
    groups: dict[str, float] = {}
    for event in prof.key_averages():
        if not event.key.startswith(("aten::", "token_by_token::")):
            continue  # a scripted function's own frame: its ops are counted one by one
        group = next((name for prefix, name in OP_GROUPS if prefix in event.key), "the other ops")
        groups[group] = groups.get(group, 0.0) + event.self_cpu_time_total / 1e3 / profiled
    return step_ms, groups


def parts_ms(lm, context_tokens: int, repeats: int) -> dict[str, float]:
    weights = llama_weights(lm.model)
    layers = list(weights.layers)
    count = len(layers) // LAYER_WEIGHTS
    config = lm.model.config
    hidden_size, inner = weights.head.shape[1], layers[6].shape[0]
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, weights.head_dim
    x, x_inner = torch.randn((1, hidden_size)), torch.randn((1, inner))
    q, k = torch.randn((1, heads, 1, head_dim)), torch.randn((1, kv_heads, 1, head_dim))
    cos, sin = torch.randn((1, 1, 1, head_dim)), torch.randn((1, 1, 1, head_dim))
    keys = [torch.randn((1, kv_heads, context_tokens, head_dim)) for _ in range(count)]
    values = [torch.randn((1, kv_heads, context_tokens, head_dim)) for _ in range(count)]
    parts: dict[str, tuple[Callable, tuple]] = {  # each run as one TorchScript call, like the pass
        "query, key, value products": (qkv_products, (x, layers)),
        "output projection products": (o_products, (x, layers)),
        "gate and up products": (gate_up_products, (x, layers)),
        "down products": (down_products, (x_inner, layers)),
        "RMS norms (61)": (norms, (x.unsqueeze(0), layers, weights.eps)),
        "rotary embedding": (rotary, (q, k, cos, sin, count)),
        "attention over the cache, with its growth": (attention, (q, k, keys, values, weights.scale, weights.gqa)),
        "activation and residual adds": (mlp_and_residuals, (x.unsqueeze(0), q, torch.randn((1, 1, inner)),
                                                             torch.randn((1, 1, inner)), count)),
    }
    timed = {}
    with torch.jit.optimized_execution(False):
        for name, (part, inputs) in parts.items():
            compiled = torch.jit.script(part)
            timed[name] = median_ms(lambda c=compiled, a=inputs: c(*a), repeats)
    timed["language-model head product"] = median_ms(lambda: lone_rows_linear(x, weights.head),
                                                     repeats)
    timed["Python around the call (embedding, cos and sin, the cache handed back)"] = python_side_ms(lm, repeats)
    return timed


def python_side_ms(lm, repeats: int) -> float:
    """run_decode's work outside the compiled call, for one row."""
    weights = llama_weights(lm.model)
    cache = new_cache(lm)
    eager_step(lm, [1, 2, 3], cache)

    def around() -> None:
        hidden = weights.embed(torch.tensor([[5]]))
        weights.rotary(hidden, torch.tensor([[cache.get_seq_length()]]))
        keys, values, block = room_to_grow(cache)  # the cache's own block, as on every step after its first
        keep_grown(cache, block, [key[..., :-1, :] for key in keys], [value[..., :-1, :] for value in values])

    return median_ms(around, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=64, help="tokens in the cache the step reads")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--profile", action="store_true", help="also each op group's time inside the real step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    lm = load_model()
    decision = lone_pass_decision(lm)
    assert decision.fast, f"the fast lone pass is not in use here: {decision.reason}"
    context = sample_context(lm, args.context)
    with torch.inference_mode():
        fast_ms, eager_ms = whole_steps(lm, context, args.steps)
        parts = parts_ms(lm, args.context, args.steps)
        in_place = in_place_ms(lm, context, args.steps) if args.profile else None
    step_ms = statistics.median(fast_ms)
    products = sum(ms for name, ms in parts.items() if "product" in name)
    weight_bytes = linear_weight_bytes(lm)
    read = read_bandwidth()
    results = {
        "threads": args.threads,
        "context_tokens": args.context,
        "fast_step_ms": step_ms,
        "eager_step_ms": statistics.median(eager_ms),
        "parts_ms": parts,
        "interpreter_and_rest_ms": step_ms - sum(parts.values()),
        "products_ms": products,
        "weight_bytes": weight_bytes,
        "products_gb_s": weight_bytes / products / 1e6,
        "step_gb_s": weight_bytes / step_ms / 1e6,
        "read_gb_s": read / 1e9,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if in_place is not None:
        results["back_to_back_step_ms"], results["in_place_ms"] = in_place
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "lone.json").write_text(json.dumps(results, indent=2))
    print(f"lone decode step at {args.context} cached tokens, {args.threads} threads, median of {args.steps}")
    print(f"  fast pass {step_ms:.1f} ms, transformers' eager pass {results['eager_step_ms']:.1f} ms "
          f"(ratio {step_ms / results['eager_step_ms']:.2f}); every step's logits torch.equal")
    for name, ms in parts.items():
        print(f"  {name:<72} {ms:6.2f} ms  {100 * ms / step_ms:4.0f}%")
    print(f"  {'the interpreter between ops, and the rest':<72} {results['interpreter_and_rest_ms']:6.2f} ms")
    print(f"  weights {weight_bytes / 1e6:.0f} MB: products {products:.1f} ms = {results['products_gb_s']:.1f} GB/s; "
          f"whole step {results['step_gb_s']:.1f} GB/s; plain read (torch.sum) {results['read_gb_s']:.1f} GB/s "
          f"-> step at {100 * results['step_gb_s'] / results['read_gb_s']:.0f}% of the read")
    if in_place is not None:
        print(f"  in place, steps back to back: {in_place[0]:.1f} ms a step; under the profiler, per step:")
        for name, ms in sorted(in_place[1].items(), key=lambda item: -item[1]):
            print(f"    {name:<70} {ms:6.2f} ms")
    print(f"  peak RSS {results['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
