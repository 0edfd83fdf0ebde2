"""The same digits in less time: passes that give transformers' own numbers bit for bit, each
used only after a probe on this machine has shown it.

- `exact_rows_kernel.py` / `.cpp`: rows through a linear layer, each summed in the order this
  CPU's 1-row product sums (the orders: the .cpp's header), several visitors' rows at once or a
  lone row at close to memory speed;
- `scripted_llama.py`: Llama-family passes as one TorchScript call (several visitors' decode
  steps, several prompts, one visitor's decode step, or a verify pass of several tokens);
- `row_products.py`: rows as 1-row products in one batched call, where the kernel is not used;
- `lone.py`: a lone visitor's decode step through the scripted pass and the kernel, and the
  verify pass whose every row has the digits of the decode step that would read it;
- `lens_kernel.py` / `.cpp`: the logit lens's rows through the LM head in one pass;
- `proofs.py`: every probe's decision, kept once per path, model and thread count.

This file is the package's front door: the rest of the project imports these names from
`engine.fast`, never a module inside it (tests/engine/test_layout.py checks). The names load on
first use, and importing this package builds and registers nothing: the kernel is built on
first use.
"""

from __future__ import annotations

import importlib

# public name -> (module inside this package, its name there)
_EXPORTS: dict[str, tuple[str, str]] = {
    **{name: ("exact_rows_kernel", name) for name in (
        "kernel_agrees", "kernel_available", "lone_rows_linear", "lone_rows_linears", "sequence_rows_linear",
        "sum_order")},
    **{name: ("lone", name) for name in (
        "LONE_PASS_ENV", "VERIFY_MAX_ROWS", "LoneDecision", "LonePass", "lone_decision", "lone_pass", "lone_step",
        "plain_filled", "verify_decision", "verify_rows", "weight_products")},
    **{name: ("scripted_llama", name) for name in (
        "LAYER_PRODUCTS", "LAYER_WEIGHTS", "LONE_ROWS", "ONE_PRODUCT", "ONE_ROW_PRODUCTS", "ROW_LOOP", "LayerParts",
        "LlamaWeights", "PromptRows", "compiled_layer_parts", "compiled_pass", "compiled_prefill",
        "KVBlock", "grows_layer_by_layer", "keep_grown", "llama_weights", "prompts_linear", "rms_norm",
        "room_to_grow", "rotate_half", "run_decode")},
    **{name: ("row_products", name) for name in ("group_products", "one_row_products")},
    "lens_kernel_usable": ("lens_kernel", "kernel_usable"),
    "lens_linear": ("lens_kernel", "lens_linear"),
    "lens_statistics": ("lens_kernel", "lens_statistics"),
    **{name: ("proofs", name) for name in (
        "MACHINE", "Proof", "Verdict", "proof_decisions", "proven", "refused", "set_aside", "settle", "shape_name")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """A public name, loaded from its module on first use and kept here."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
