"""Each draft method's picture of its round (engine/speculative: `DraftPicture`, set while a
method's `picturing` is on): what it guessed, the draft's leading tokens where it guessed, and
what it made them from, on the real model; and the page's HTML of it (ui/views/draft_pictures.py)."""

from __future__ import annotations

import pytest
import torch

from engine import SamplerSettings, StopSettings
from engine.speculative import DraftModel, EarlyExit, Lookahead, MtpDraft, SpeculativeGeneration, draft_for, self_draft
from ui.views.breaking_the_chain import method_note
from ui.views.draft_pictures import draft_picture_html

GREEDY = SamplerSettings(temperature=0.0)
PROMPT = "The three primary colours of light are red, green and blue. The three primary colours of light are"


def rounds_with_pictures(lm, draft, picturing: bool = True, rounds: int = 4):
    """(round record, the draft's picture after it, the context's last token before it) per round."""
    draft.picturing = picturing
    generation = SpeculativeGeneration(lm, PROMPT, draft=draft, k=3, sampler=GREEDY,
                                       stop=StopSettings(max_new_tokens=24))
    seen = []
    for _ in range(rounds):
        before = generation.context_ids[-1]
        generation.step()
        seen.append((generation.rounds[-1], draft.last_picture, before))
    return seen


METHODS = ["medusa-heads", "mtp", "lookahead", "early-exit-24", "self-draft-bfloat16"]


def make(lm, method: str):
    if method == "lookahead":
        return Lookahead(lm.eos_ids)
    if method == "early-exit-24":
        return EarlyExit(lm, 24)
    if method == "self-draft-bfloat16":
        return DraftModel(self_draft(lm, "bfloat16"), lm, name=method)
    return draft_for(lm, method)


def test_a_picture_is_kept_only_while_picturing_so_a_race_pays_nothing(lm) -> None:
    for draft in (make(lm, method) for method in METHODS[:4]):
        assert all(picture is None for _, picture, _ in rounds_with_pictures(lm, draft, picturing=False, rounds=3))


@pytest.mark.parametrize("method", METHODS)
def test_each_picture_is_the_rounds_own_guesses_and_what_made_them(lm, method: str) -> None:
    draft = make(lm, method)
    pictured = [(record, picture, before) for record, picture, before in rounds_with_pictures(lm, draft)
                if record.drafted]
    assert pictured, "the method guessed in none of the rounds"
    for record, picture, before in pictured:
        assert picture is not None and picture.method == method
        assert picture.guesses == tuple(piece.token_id for piece in record.drafted)
        assert picture.after_token == before  # every guess follows the context's last token
        if method == "lookahead":
            assert picture.source in ("text", "pool", "jacobi") and picture.leaders == ()
            assert all(len(gram) >= 1 for gram in picture.pool) and picture.pool_size >= len(picture.pool)
            continue
        assert len(picture.leaders) == len(picture.guesses)
        for guess, leaders in zip(picture.guesses, picture.leaders, strict=True):
            probs = [leader.prob for leader in leaders]
            assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
            assert leaders[0].token_id == guess  # greedy: the guess is the draft's own top token (no penalty)
        if method.startswith("early-exit"):
            assert (picture.exit_layer, picture.layers) == (24, lm.geometry.layers)
    html = draft_picture_html(pictured[-1][1], pictured[-1][0], lm.texts)
    assert f'data-method="{method}"' in html and f'data-guesses="{len(pictured[-1][1].guesses)}"' in html
    assert "<figcaption" in html  # each picture says what it shows
    assert html.count('class="dp-verdict"') == len(pictured[-1][1].guesses)  # each guess said kept, rejected or not


def test_the_heads_leaders_are_the_draft_vocabularys_softmax_of_each_head(lm) -> None:
    draft = draft_for(lm, "medusa-heads")
    draft.picturing = True
    generation = SpeculativeGeneration(lm, PROMPT, draft=draft, k=3, sampler=GREEDY,
                                       stop=StopSettings(max_new_tokens=24))
    generation.step()  # reads the prompt; the heads then draft from the state it kept
    with torch.inference_mode():
        probs = draft._scores(draft.trained.net(draft._hidden)[:3]).float().softmax(dim=-1)
    generation.step()
    for head, leaders in enumerate(draft.last_picture.leaders):
        top = torch.topk(probs[head], 3)
        assert [leader.token_id for leader in leaders] == draft.vocab_ids[top.indices].tolist()
        assert [leader.prob for leader in leaders] == pytest.approx(top.values.tolist(), abs=1e-7)


def test_a_trained_drafts_picture_says_when_it_stopped_because_it_was_unsure(lm) -> None:
    draft = draft_for(lm, "mtp")
    seen = rounds_with_pictures(lm, draft, rounds=8)
    for record, picture, _ in seen:
        if picture is None:
            continue
        html = draft_picture_html(picture, record, lm.texts)
        assert ('data-stopped="unsure"' in html) == (picture.stopped_unsure is not None)
        if picture.stopped_unsure is not None:
            assert f"after guess {len(picture.guesses)}" in html and "guesses again only at 50% or more" in html
    assert any(picture is not None and picture.stopped_unsure is not None for _, picture, _ in seen)


def test_the_trained_drafts_round_note_says_when_they_guess_again(lm) -> None:
    for draft, said in ((draft_for(lm, "mtp"), True), (MtpDraft(lm, go_on=0.0), False)):
        record = next(r for r, _, _ in rounds_with_pictures(lm, draft, rounds=3) if r.drafted)
        note = method_note(record, draft, lm.texts)
        assert note is not None and note.startswith("Multi-token prediction")
        assert ("guesses again only after a guess it gave at least 50%" in note) == said
