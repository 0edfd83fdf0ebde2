"""Early-exit self-speculation: draft with the model's own first layers, verify with all of them.

The draft is the target cut short: its first `layers` decoder layers (the very same weight
tensors, nothing copied), then its own final norm and LM head, which is the logit lens of
engine/inside.py at that layer used as a draft model. It runs as any draft model does
(`DraftModel`: its own KV cache for those layers, the same sampler chain, cropped after each
round), so the output stays the target's: the verify pass and the accept / reject rule decide.

It pays only where the shallow layers already agree with the whole model. SmolLM2-135M was
not trained for early exit: its lens agrees with the final token about 1 time in 3 at layer 24
of 30 (`layer_agreement`), while a draft token there still costs most of a full step (24 of
30 layers, and all of the 113 MB LM head). `best_exit` weighs both, and says so when no layer
pays.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from engine.errors import SettingsError
from engine.inside import final_norm
from engine.loading import LoadedModel
from engine.speculative.drafting import DraftModel, DraftPicture, Leader
from engine.speculative.rule import expected_tokens_per_round


def _decoder_layers(model: nn.Module) -> tuple[nn.Module, str]:
    """The module holding the decoder's layer list, and the list's attribute name."""
    decoder = model.get_decoder()
    for name in ("layers", "h"):
        if isinstance(getattr(decoder, name, None), nn.ModuleList):
            return decoder, name
    raise SettingsError("early-exit draft", type(model).__name__, "a model whose decoder layers this app can find")


# Each target model's cut modules, by layer count: a cut is read-only and shareable, and a fresh
# one would be probed afresh (a fast pass's proof is kept per module), a second on a visitor's
# first round; it goes with the target's model
_cuts: weakref.WeakKeyDictionary[nn.Module, dict[int, nn.Module]] = weakref.WeakKeyDictionary()
_cuts_lock = threading.Lock()


def truncated(target: LoadedModel, layers: int) -> LoadedModel:
    """The target cut after its first `layers` decoder layers: the same tensors, its own final
    norm and head, a config that says `layers` (so its KV cache has that many). The cut module
    is made once per target model and layer count, and shared."""
    decoder, name = _decoder_layers(target.model)
    total = len(getattr(decoder, name))
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers < total:
        raise SettingsError("early-exit layer", layers, f"a whole number from 1 to {total - 1} (of {total} layers)")
    with _cuts_lock:
        cuts = _cuts.setdefault(target.model, {})
        if layers not in cuts:
            cuts[layers] = _cut(target.model, layers, name)
        cut = cuts[layers]
    short = target.name.split(" (")[0]
    return replace(target, model=cut, geometry=replace(target.geometry, layers=layers),
                   name=f"{short} (first {layers} of {total} layers)")


def _cut(model: nn.Module, layers: int, name: str) -> nn.Module:
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    twin = copy.deepcopy(model, memo=shared)  # modules and config copied, every tensor shared
    twin_decoder, _ = _decoder_layers(twin)
    setattr(twin_decoder, name, nn.ModuleList(list(getattr(twin_decoder, name))[:layers]))
    config = twin.config.get_text_config()
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:layers]
    return twin.eval()


class EarlyExit(DraftModel):
    """Draft with the target's first `layers` layers, its final norm and head; verify with all.

    Args:
        target: the model whose output the drafts must match.
        layers: where the draft exits (1 to the target's layer count - 1).
    """

    def __init__(self, target: LoadedModel, layers: int) -> None:
        super().__init__(truncated(target, layers), target, name=f"early-exit-{layers}")
        self.exit_layer = layers
        self.layers = target.geometry.layers
        self.label = f"early exit: the first {layers} of {target.geometry.layers} layers draft"

    def _picture(self, tokens: tuple[int, ...], leaders: tuple[tuple[Leader, ...], ...], after: int) -> DraftPicture:
        return DraftPicture(self.name, tokens, leaders, after, exit_layer=self.exit_layer, layers=self.layers)


# ---- which layer to exit at ------------------------------------------------------------------


@torch.inference_mode()
def layer_agreement(lm: LoadedModel, sequences: Sequence[tuple[Sequence[int], int]]) -> list[float]:
    """Per layer 0..L, how often the lens there (its state through the final norm and head) picks
    the whole model's own next token, over every position from `start` of each (token ids,
    start): the acceptance rate a greedy early-exit draft at that layer would have."""
    norm, head = final_norm(lm.model), lm.model.get_output_embeddings()
    if norm is None or head is None:
        raise SettingsError("early-exit draft", lm.name, "a model with a final norm and an LM head this app can find")
    agree: torch.Tensor | None = None
    count = 0
    for ids, start in sequences:
        out = lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), output_hidden_states=True)
        final = out.logits[0, start:].argmax(dim=-1)
        states = out.hidden_states  # L + 1: the embeddings, then each layer (the last already normalised)
        hits = []
        for index, state in enumerate(states):
            h = state[0, start:]
            rows = head(h if index == len(states) - 1 else norm(h[None])[0])
            hits.append(int((rows.argmax(dim=-1) == final).sum()))
        agree = torch.tensor(hits, dtype=torch.float64) + (0 if agree is None else agree)
        count += final.numel()
    if agree is None or count == 0:
        raise SettingsError("sequences", len(sequences), "at least one sequence longer than its start")
    return (agree / count).tolist()


def layer_bytes(lm: LoadedModel) -> int:
    """Bytes of the decoder layers' weights (a bandwidth-bound step reads each once)."""
    decoder, name = _decoder_layers(lm.model)
    return sum(p.numel() * p.element_size() for p in getattr(decoder, name).parameters())


@dataclass(frozen=True)
class ExitChoice:
    """The best exit layer and draft length by the expected-speed formula, and what it predicts."""

    layer: int
    k: int
    acceptance: float  # the measured agreement at that layer
    draft_cost: float  # one draft token's bytes read, as a share of a full step's
    expected_speedup: float  # E[tokens per round] / (k · draft_cost + 1); below 1: it does not pay


def best_exit(agreement: Sequence[float], layer_bytes: int, head_bytes: int, layers: int,
              ks: Sequence[int] = (1, 2, 3, 4)) -> ExitChoice:
    """The (layer, k) with the highest expected speed-up, where a round costs k draft tokens
    (each reading its share of the layers' weights and the whole head, as a bandwidth-bound step
    does) and one verify pass (about one step on this CPU), and yields (1 - α^(k+1)) / (1 - α)
    tokens for an acceptance rate α."""
    step = layer_bytes + head_bytes
    best: ExitChoice | None = None
    for layer in range(1, layers):
        alpha = float(agreement[layer])
        cost = (layer_bytes * layer / layers + head_bytes) / step
        for k in ks:
            speedup = expected_tokens_per_round(alpha, k) / (k * cost + 1)
            if best is None or speedup > best.expected_speedup:
                best = ExitChoice(layer, k, alpha, cost, speedup)
    assert best is not None, "a model has at least two layers"
    return best
