"""Read the KV cache's real tensors: how many positions it holds and what it weighs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig


@dataclass(frozen=True)
class KVSnapshot:
    """The KV cache as it stands, measured from its tensors, with the formula beside it."""

    positions: int  # sequence positions held
    layer_shapes: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # per layer: (K shape, V shape)
    dtype: str
    bytes: int  # sum of every K and V tensor's bytes
    formula_bytes: int  # 2 x layers x kv_heads x head_dim x positions x bytes per value
    formula: str

    @property
    def layers(self) -> int:
        return len(self.layer_shapes)


@dataclass(frozen=True)
class KVGeometry:
    """The model's KV shape parameters, from its config."""

    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> KVGeometry:
        config = config.get_text_config()
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(layers=config.num_hidden_layers, kv_heads=kv_heads, head_dim=head_dim)

    def bytes_for(self, positions: int, bytes_per_value: int) -> int:
        """K and V, every layer, every KV head: the cache's size at `positions`."""
        return 2 * self.layers * self.kv_heads * self.head_dim * positions * bytes_per_value


def _layer_tensors(cache: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    layers = getattr(cache, "layers", None) or []
    return [(layer.keys, layer.values) for layer in layers
            if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0]


def _shared_shapes(tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Each layer's (K shape, V shape); layers of one shape share one tuple (a step's record
    keeps this, so thirty equal copies would cost ~6 KB a step)."""
    seen: dict[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]] = {}
    return tuple(seen.setdefault(pair, pair) for pair in ((tuple(k.shape), tuple(v.shape)) for k, v in tensors))


def read_kv(cache: object | None, geometry: KVGeometry, model_dtype: torch.dtype) -> KVSnapshot:
    """Measure the cache from its tensors (an empty or absent cache holds 0 positions)."""
    tensors = _layer_tensors(cache) if cache is not None else []
    positions = tensors[0][0].shape[-2] if tensors else 0
    dtype = tensors[0][0].dtype if tensors else model_dtype
    per_value = torch.empty((), dtype=dtype).element_size()
    measured = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in tensors)
    formula = (f"2 x {geometry.layers} layers x {geometry.kv_heads} KV heads x {geometry.head_dim} "
               f"head dim x {positions} positions x {per_value} bytes")
    return KVSnapshot(
        positions=positions,
        layer_shapes=_shared_shapes(tensors),
        dtype=str(dtype).removeprefix("torch."),
        bytes=measured,
        formula_bytes=geometry.bytes_for(positions, per_value),
        formula=formula,
    )


def same_entries(ours: object, theirs: object) -> bool:
    """Whether two caches hold the same keys and values in every layer, bit for bit (torch.equal)."""
    return all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(ours.layers, theirs.layers, strict=True))
