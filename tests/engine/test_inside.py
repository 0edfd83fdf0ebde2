"""Inside the forward pass (engine/inside.py): the logit lens, the new token's attention and the
time per layer, checked against transformers' own computation on the real model, and on tiny
random models of other architectures."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

from engine import Generation, GenerationFinished, LoadedModel, SamplerSettings, SettingsError, StopSettings
from engine.inside import final_norm
from engine.kvcache import KVGeometry
from engine.loading import ModelSource
from engine.tokens import TokenTexts
from tests.tiny import CONTEXT_WINDOW, tiny_tokenizer

GREEDY = SamplerSettings(temperature=0.0)
PROMPT = "The three primary colours of light are"


def eager_twin(model: torch.nn.Module) -> torch.nn.Module:
    """The model with transformers' eager attention (which returns its weights), the same tensors."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    twin = copy.deepcopy(model, memo=shared)
    twin.config._attn_implementation = "eager"
    return twin


def steps_with_inside(lm: LoadedModel, prompt: str, steps: int) -> Generation:
    gen = Generation(lm, prompt, sampler=GREEDY, stop=StopSettings(max_new_tokens=32, ignore_eos=True))
    gen.inside = True
    for _ in range(steps):
        gen.step()
    return gen


def test_the_lens_is_the_final_norm_and_head_on_each_layers_hidden_state(lm) -> None:
    """Against transformers' output_hidden_states (L + 1 states, the last already normalised):
    every layer's lens is softmax(head(norm(h))), the last layer's is the step's own distribution
    bit for bit, and layer 0 echoes the input token (tied embeddings)."""
    gen = steps_with_inside(lm, PROMPT, 1)
    view, step = gen.inside_view(), gen.steps[0]
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([gen.prompt_ids]), output_hidden_states=True)
    states = out.hidden_states
    assert len(view.layers) == len(states) == lm.geometry.layers + 1
    norm, head = final_norm(lm.model), lm.model.get_output_embeddings()
    for layer in view.layers[:-1]:
        with torch.inference_mode():
            logits = head(norm(states[layer.layer][0, -1][None, None]))[0, 0]
        expected = logits.softmax(-1)
        assert layer.top_token_id == int(expected.argmax())
        assert layer.top_prob == pytest.approx(float(expected.max()), abs=1e-5)
        assert layer.pick_prob == pytest.approx(float(expected[step.token_id]), abs=1e-5)
        entropy = float(torch.special.entr(expected.double()).sum()) / math.log(2)
        assert layer.entropy_bits == pytest.approx(entropy, abs=1e-4)
        picked = logits[step.token_id]  # the rank, up to logits within float32 rounding of the pick's
        assert int((logits > picked + 1e-4).sum()) + 1 <= layer.pick_rank <= int((logits > picked - 1e-4).sum()) + 1
    with torch.inference_mode():  # the last state is normalised once: the head gives the step's logits
        assert torch.equal(head(states[-1][:, -1:])[0, 0], gen.raw_logits(1))
    last = view.layers[-1]
    probs = gen.raw_logits(1).softmax(-1)
    assert (last.top_token_id, last.top_prob, last.pick_prob) == (step.token_id, float(probs.max()), step.prob)
    assert last.entropy_bits == step.distribution.raw_entropy_bits  # the step's own entropy, not a second one
    assert last.pick_rank == 1 and view.first_lead is not None
    assert view.layers[0].top_token_id == gen.prompt_ids[-1] and view.layers[0].top_prob > 0.99


def test_the_new_tokens_attention_is_transformers_eager_weights_and_reads_the_cached_values(lm) -> None:
    gen = steps_with_inside(lm, PROMPT, 3)
    view = gen.inside_view()
    context = gen.context_ids[:-1]  # what the third step's pass had read
    eager = eager_twin(lm.model)
    outputs = {}
    for index, layer in enumerate(eager.model.layers):
        layer.self_attn.o_proj.register_forward_pre_hook(
            lambda module, args, index=index: outputs.__setitem__(index, args[0][0, -1].clone()))
    with torch.inference_mode():
        reference = eager(input_ids=torch.tensor([context]), output_attentions=True)
    heads, groups = lm.model.config.num_attention_heads, lm.model.config.num_attention_heads // lm.geometry.kv_heads
    assert view.kv_head_of == tuple(h // groups for h in range(heads))  # 9 query heads reading 3 KV heads
    cache = gen._cache
    for layer in view.layers[1:]:
        ours = torch.tensor(layer.attention)  # [heads, positions]
        assert ours.shape == (heads, view.position + 1)
        torch.testing.assert_close(ours, reference.attentions[layer.layer - 1][0, :, -1], rtol=0, atol=1e-5)
        values = cache.layers[layer.layer - 1].values[0, :, : view.position + 1].repeat_interleave(groups, dim=0)
        mixed = torch.einsum("hk,hkd->hd", ours, values).reshape(-1)
        torch.testing.assert_close(mixed, outputs[layer.layer - 1], rtol=0, atol=1e-5)
    first = torch.tensor([layer.attention for layer in view.layers[1:]])[:, :, 0]  # weight on the first token
    assert float(first.mean()) > 0.3  # an attention sink


def test_looking_inside_never_changes_a_number_of_the_step(lm) -> None:
    plain = Generation(lm, PROMPT, sampler=SamplerSettings(temperature=0.8), seed=5)
    inside = Generation(lm, PROMPT, sampler=SamplerSettings(temperature=0.8), seed=5)
    inside.inside = True
    for _ in range(4):
        a, b = plain.step(), inside.step()
        assert a.token_id == b.token_id
        assert torch.equal(plain.raw_logits(), inside.raw_logits())
    for ours, theirs in zip(plain._cache.layers, inside._cache.layers, strict=True):
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


def test_time_per_layer_adds_up_to_the_pass_and_the_head_is_a_fifth_of_the_bytes(lm) -> None:
    view = steps_with_inside(lm, PROMPT, 2).inside_view()
    measured = sum(layer.ms for layer in view.layers) + view.head_ms
    assert measured == pytest.approx(view.forward_ms, rel=0.10)
    assert all(layer.attention_ms is not None and layer.mlp_ms is not None for layer in view.layers[1:])
    assert all(layer.attention_ms + layer.mlp_ms <= layer.ms * 1.001 for layer in view.layers[1:])
    weights = sum(layer.weight_bytes for layer in view.layers[1:]) + view.head_bytes
    assert view.head_bytes == 49_152 * 576 * 4 and 0.15 < view.head_bytes / weights < 0.25


def test_a_step_taken_without_the_view_is_looked_inside_by_repeating_its_pass_exactly(lm) -> None:
    gen = Generation(lm, PROMPT, sampler=GREEDY)
    for _ in range(3):
        gen.step()
    repeated = gen.inside_view(2)
    looked = steps_with_inside(lm, PROMPT, 2).inside_view(2)
    assert [v.top_token_id for v in repeated.layers] == [v.top_token_id for v in looked.layers]
    assert repeated.layers[-1].pick_prob == gen.steps[1].prob


def test_bad_requests_get_the_engines_own_errors(lm) -> None:
    gen = steps_with_inside(lm, "Hello", 1)
    with pytest.raises(SettingsError, match="step"):
        gen.inside_view(5)
    with pytest.raises(SettingsError, match="layer"):
        gen.inside_view().layer(99)
    gen.close()
    with pytest.raises(GenerationFinished):
        gen.inside_view()


def fast_lone_pass_or_skip(lm) -> None:
    from engine.fast import lone_pass
    from engine.forward import eager_step
    if lone_pass(lm, eager_step) is None:
        pytest.skip("the fast lone pass is not proven on this CPU: every look inside runs on the twin")


def test_a_decode_step_looked_inside_runs_the_fast_pass_in_parts_and_shows_the_twins_numbers(lm, monkeypatch) -> None:
    from engine import inside as inside_module
    fast_lone_pass_or_skip(lm)
    assert inside_module._proven_parts(lm) is not None
    in_parts = []
    real = inside_module._pass_in_parts
    monkeypatch.setattr(inside_module, "_pass_in_parts", lambda *args: in_parts.append(1) or real(*args))
    fast = steps_with_inside(lm, PROMPT, 3)
    assert len(in_parts) == 2  # steps 2 and 3; step 1 reads the prompt on the twin
    monkeypatch.setattr(inside_module, "_proven_parts", lambda lm: None)
    twin = steps_with_inside(lm, PROMPT, 3)
    assert len(in_parts) == 2
    for position in (1, 2):
        ours, theirs = fast._captures[position], twin._captures[position]
        assert all(torch.equal(a, b) for a, b in zip(ours.hidden, theirs.hidden, strict=True))
        assert all(torch.equal(ours.attention[k], theirs.attention[k]) for k in theirs.attention)
        assert torch.equal(fast.raw_logits(position + 1), twin.raw_logits(position + 1))
    assert fast.inside_view().layer(5).attention == twin.inside_view().layer(5).attention


def test_parts_that_differ_from_the_twin_by_a_bit_leave_the_twin_in_charge(lm, monkeypatch, forget_proofs) -> None:
    from engine import inside as inside_module
    from engine.fast import LayerParts, compiled_layer_parts
    fast_lone_pass_or_skip(lm)
    real = compiled_layer_parts()
    off_by_a_bit = LayerParts(real.attention, lambda *args: real.mlp(*args) * (1 + 2 ** -20), real.head)
    monkeypatch.setattr(inside_module, "compiled_layer_parts", lambda: off_by_a_bit)
    forget_proofs(inside_module.PARTS_PATH)
    assert inside_module._proven_parts(lm) is None
    plain, looked = Generation(lm, PROMPT, sampler=GREEDY), steps_with_inside(lm, PROMPT, 3)
    for _ in range(3):
        plain.step()
    assert torch.equal(plain.raw_logits(), looked.raw_logits()) and looked.inside_view().layers[-1].pick_rank == 1


def tiny_of(config, model_class, name: str) -> LoadedModel:
    tokenizer = tiny_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(config).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, source=ModelSource("folder", name), name=name,
                       device=torch.device("cpu"), dtype=torch.float32, eos_ids=(tokenizer.eos_token_id,),
                       context_window=CONTEXT_WINDOW, geometry=KVGeometry.from_config(config),
                       parameters=sum(p.numel() for p in model.parameters()), load_seconds=0.0, from_cache=False,
                       texts=TokenTexts(tokenizer))


def tiny_models() -> list[LoadedModel]:
    vocab = len(tiny_tokenizer())
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  max_position_embeddings=CONTEXT_WINDOW)
    return [
        tiny_of(LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=1), LlamaForCausalLM,
                "Llama, multi-query"),
        tiny_of(LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=4), LlamaForCausalLM,
                "Llama, full attention"),
        tiny_of(GemmaConfig(**common, num_attention_heads=4, num_key_value_heads=2, head_dim=16), GemmaForCausalLM,
                "Gemma (scaled RMSNorm), grouped-query"),
        tiny_of(GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT_WINDOW),
                GPT2LMHeadModel, "GPT-2 (ln_f)"),
        # a window shorter than the context: the cache keeps 3 keys a layer, the weights span every position
        tiny_of(MistralConfig(**common, num_attention_heads=4, num_key_value_heads=2, sliding_window=4),
                MistralForCausalLM, "Mistral, sliding-window cache"),
    ]


@pytest.mark.parametrize("model", tiny_models(), ids=lambda m: m.name)
def test_every_architecture_gives_its_lens_and_attention_or_says_why(model: LoadedModel) -> None:
    plain = Generation(model, "abcabcab", sampler=GREEDY)
    inside = Generation(model, "abcabcab", sampler=GREEDY)
    inside.inside = True
    for _ in range(3):
        plain.step()
        inside.step()
        assert torch.equal(plain.raw_logits(), inside.raw_logits())
    view = inside.inside_view()
    assert len(view.layers) == model.model.config.num_hidden_layers + 1
    assert view.unavailable == ()
    with torch.inference_mode():
        reference = eager_twin(model.model)(input_ids=torch.tensor([inside.context_ids[:-1]]), output_attentions=True)
    for layer in view.layers[1:]:
        assert all(len(head) == view.position + 1 for head in layer.attention)
        torch.testing.assert_close(torch.tensor(layer.attention), reference.attentions[layer.layer - 1][0, :, -1],
                                   rtol=0, atol=1e-5)
    assert view.layers[-1].pick_prob == inside.steps[-1].prob


def test_the_cli_writes_each_steps_inside_into_a_trace_that_loads_back(lm, cli_on_lm, tmp_path, capsys) -> None:
    from engine import load_trace
    from engine.cli import main

    path = tmp_path / "inside.json"
    assert main(["--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "2", "--inside",
                 "--json", str(path)]) == 0
    assert "inside: pick leads from layer" in capsys.readouterr().out
    trace = load_trace(path)
    for step in trace["steps"]:
        layers = step["inside"]["layers"]
        assert [entry["layer"] for entry in layers] == list(range(lm.geometry.layers + 1))
        for entry in layers:
            assert {"top_token_id", "top_prob", "pick_prob", "pick_rank", "entropy_bits", "ms"} <= set(entry)
        assert "attention" not in layers[0]
        # the fed token sits just before the new one: its query reads every position up to its own
        assert all(len(entry["attention"]) == 9 and len(entry["attention"][0]) == step["position"]
                   for entry in layers[1:])
