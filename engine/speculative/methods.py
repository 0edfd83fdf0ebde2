"""Every draft method by name: the CLI's `--speculative`, a trace's "method", the page's race.

Names say what the method is: `prompt-lookup`, `self-draft-bfloat16`, `self-draft-int8`,
`lookahead`, `early-exit` (the layer chosen from the measured agreement; a trace records it as
`early-exit-<layer>`, and that name rebuilds exactly that draft), `medusa-heads` and `mtp` (the
draft heads and the multi-token-prediction module trained for the bundled model, in assets/).
"""

from __future__ import annotations

import threading
import weakref

import torch
from transformers import PreTrainedModel

from engine.errors import SettingsError
from engine.inside import final_norm
from engine.loading import LoadedModel
from engine.speculative.drafting import SELF_DRAFT_KINDS, DraftMethod, DraftModel, PromptLookup, self_draft
from engine.speculative.early_exit import EarlyExit, ExitChoice, best_exit, layer_agreement, layer_bytes
from engine.speculative.heads import MEDUSA, MTP, MedusaHeads, MtpDraft, TrainedDraft, load_trained
from engine.speculative.lookahead import Lookahead

DRAFT_METHODS = ("prompt-lookup", "self-draft-bfloat16", "self-draft-int8", "lookahead", "early-exit", MEDUSA, MTP)
# the agreement is measured on the model's own greedy text after these (free-form: nothing to copy)
EXIT_PROMPTS = ("Write a short story about a robot who learns to paint.",
                "Explain in a few sentences why the sky is blue.")
EXIT_TOKENS = 32

_exits: weakref.WeakKeyDictionary[PreTrainedModel, ExitChoice] = weakref.WeakKeyDictionary()
_exits_lock = threading.Lock()


def draft_for(target: LoadedModel, name: str) -> DraftMethod:
    """A draft method by its name. A self-draft copies the target's weights each call, and
    `early-exit` measures its layer once per model: keep the result rather than asking again."""
    if name == "prompt-lookup":
        return PromptLookup(target.eos_ids)
    if name.startswith("self-draft-") and name.removeprefix("self-draft-") in SELF_DRAFT_KINDS:
        return DraftModel(self_draft(target, name.removeprefix("self-draft-")), target, name=name)
    if name == "lookahead":
        return Lookahead(target.eos_ids)
    if name in (MEDUSA, MTP):  # trained for the bundled model; its weights checked once, shared
        trained = trained_for(target, name)
        return MedusaHeads(target, trained) if name == MEDUSA else MtpDraft(target, trained)
    if name == "early-exit":
        return EarlyExit(target, chosen_exit(target).layer)
    if name.startswith("early-exit-") and name.removeprefix("early-exit-").isdigit():
        return EarlyExit(target, int(name.removeprefix("early-exit-")))
    raise SettingsError("draft method", name, f"one of {', '.join(DRAFT_METHODS)} (or early-exit-<layer>)")


_trained: weakref.WeakKeyDictionary[PreTrainedModel, dict[str, TrainedDraft]] = weakref.WeakKeyDictionary()


def trained_for(lm: LoadedModel, method: str) -> TrainedDraft:
    """The shipped weights of a trained draft (MEDUSA or MTP) for `lm`, read and checked against
    their recorded checksum once per model; ModelLoadError / SettingsError say why they cannot be."""
    with _exits_lock:
        kept = _trained.setdefault(lm.model, {})
        if method not in kept:
            kept[method] = load_trained(method, lm)
        return kept[method]


def chosen_exit(lm: LoadedModel) -> ExitChoice:
    """The early-exit layer and draft length with the best expected speed-up for `lm`, from its
    lens agreement on its own greedy text (measured once per model)."""
    with _exits_lock:
        if lm.model not in _exits:
            _exits[lm.model] = _measure_exit(lm)
        return _exits[lm.model]


@torch.inference_mode()
def _measure_exit(lm: LoadedModel) -> ExitChoice:
    if final_norm(lm.model) is None:
        raise SettingsError("early-exit draft", lm.name, "a model with a final norm this app can find")
    sequences = []
    for prompt in EXIT_PROMPTS:
        ids = lm.tokenizer(prompt, return_tensors="pt").input_ids.to(lm.device)
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=EXIT_TOKENS,
                                do_sample=False, pad_token_id=lm.eos_ids[0] if lm.eos_ids else None)
        sequences.append((out[0].tolist(), ids.shape[1] - 1))  # from the prompt's last position on
    head = lm.model.get_output_embeddings()
    head_bytes = sum(p.numel() * p.element_size() for p in head.parameters())
    return best_exit(layer_agreement(lm, sequences), layer_bytes(lm), head_bytes, lm.geometry.layers)
