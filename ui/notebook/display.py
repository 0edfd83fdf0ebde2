"""A step, a generation, a look inside the pass and a speculative round as HTML for a notebook:
the app's own views (ui/views), in one block that follows the notebook's light or dark theme and
needs no server and nothing from the network.

`enable()` teaches IPython to draw the engine's records this way, so `gen.step()` at the end of a
cell shows the step. The engine knows nothing of this: the formatters are registered from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine import Generation, InsideView, SpeculativeGeneration, StepRecord, TokenPiece, visible
from engine.speculative import RoundRecord
from ui.views.bars import distribution_bars_html
from ui.views.breaking_the_chain import positions_html, rejection_html, round_line_html, speculative_chips_html
from ui.views.chips import context_html, prompt_chips
from ui.views.format import esc, pct, quoted
from ui.views.inside import attention_by_position, lens_cells_html, pass_text
from ui.views.records import (
    FINISH_LABELS,
    PANEL_CSS,
    decision_html,
    eos_names,
    heading_html,
    stages_html,
    termination_html,
)
from ui.views.theme import theme_variables

CANDIDATES = 8  # rows of the distribution before "all other"


# The page colours of either theme. Which one: the reader's system setting, unless the notebook
# says otherwise (JupyterLab marks its body, VS Code its body's class, Colab its root element).
_LIGHT, _DARK = theme_variables("light"), theme_variables("dark")
NOTEBOOK_CSS = (
    "<style>"
    f".tbt-nb{{{_LIGHT};color:inherit;font-family:inherit;line-height:1.45;max-width:980px}}"
    f"@media (prefers-color-scheme: dark){{.tbt-nb{{{_DARK}}}}}"
    f"body[data-jp-theme-light='true'] .tbt-nb,body.vscode-light .tbt-nb,html[theme='light'] .tbt-nb{{{_LIGHT}}}"
    f"body[data-jp-theme-light='false'] .tbt-nb,body.vscode-dark .tbt-nb,html[theme='dark'] .tbt-nb{{{_DARK}}}"
    ".tbt-nb h3.tbt-heading{font-size:1.15rem}"
    ".tbt-nb .tbt-row{display:flex;flex-wrap:wrap;gap:1.2rem}.tbt-nb .tbt-row>div{flex:1 1 380px;min-width:0}"
    ".tbt-nb .tbt-recorded{font-size:.85rem;color:var(--tbt-muted)}"
    "</style>"
)


def block(body: str) -> str:
    """One notebook output: the shared CSS and `body`, in the block that carries the theme."""
    return f'<div class="tbt-nb">{NOTEBOOK_CSS}{PANEL_CSS}{body}</div>'


@dataclass(frozen=True)
class RecordTexts:
    """The texts of the tokens a step record names (its pick, the sampler's own pick and the
    distribution's leaders), where no model is at hand: enough for the decision's words."""

    record: StepRecord

    def piece(self, token_id: int) -> TokenPiece:
        if token_id == self.record.token_id:
            return self.record.token
        for candidate in self.record.distribution.top:
            if candidate.token_id == token_id:
                return TokenPiece(token_id, candidate.text, special=False, partial_bytes=False)
        raise KeyError(f"token {token_id} is not among the tokens step {self.record.index} recorded")


def step_parts_html(record: StepRecord, texts: object, eos_names: str) -> str:
    """A step's panels as the Step page lays them out: the distribution with the pick beside the
    sampler's decision and its stages, then the stop check."""
    distribution = record.distribution
    bars = heading_html(
        f"Next-token distribution at step {record.index}",
        f"Raw softmax (the model) and the final distribution (after the sampler, drawn from); ▶ the pick. "
        f"Entropy raw {distribution.raw_entropy_bits:.2f} bits, final {distribution.final_entropy_bits:.2f}.",
    ) + distribution_bars_html(distribution, record.token_id, CANDIDATES)
    decision = (heading_html("Sampler decision", "Each stage in the order applied, then the pick.")
                + stages_html(record.decision) + decision_html(record.decision, distribution, texts))
    check = heading_html("Check: stop or go on?", "Every condition after this step.") + termination_html(
        record.termination, eos_names)
    return f'<div class="tbt-row"><div>{bars}</div><div>{decision}</div></div>{check}'


def step_html(record: StepRecord) -> str:
    """One step on its own: the new token and the panels that say how it was chosen."""
    title = (f"<p><b>Step {record.index}</b>: {esc(quoted(record.token.text))} at position {record.position} · "
             f"raw {pct(record.prob)} (rank {record.rank}) · final {pct(record.final_prob)}</p>")
    return block(title + step_parts_html(record, RecordTexts(record), eos_names=""))


def generation_html(gen: Generation) -> str:
    """A generation: its context as chips (the prompt, then a chip per step), and the latest step."""
    steps = gen.steps
    state = (f"finished: {FINISH_LABELS[gen.finish_reason]}" if gen.finish_reason
             else f"{len(steps)} step{'' if len(steps) == 1 else 's'} so far")
    sampler = gen.sampler
    title = (f"<p><b>{esc(gen.lm.name)}</b> · {state} · temperature {sampler.temperature:g}, top-k "
             f"{sampler.top_k}, top-p {sampler.top_p:g}, min-p {sampler.min_p:g} · seed {gen.seed}</p>")
    chips = context_html(prompt_chips(gen.prompt_pieces), steps)
    latest = (step_parts_html(steps[-1], gen.lm.texts, eos_names(gen.lm)) if steps
              else "<p>No step yet: call <code>gen.step()</code>.</p>")
    return block(title + chips + latest)


def _attention_cell(name: str, weight: float) -> str:
    """A context position tinted by the share of attention it got (dark text on a strong tint, in
    either theme, so the name stays readable)."""
    alpha = min(1.0, 3 * weight)
    ink = "color:#212529;" if alpha > 0.4 else ""
    return (f'<span class="tbt-att" style="background:rgba(230,119,0,{alpha:.3f});{ink}" '
            f'title="{esc(name)}: {pct(weight)}">{esc(name)}</span>')


def inside_html(view: InsideView, pick: TokenPiece, pieces: Sequence[TokenPiece]) -> str:
    """Inside one step's pass: the logit lens, layer by layer, and where the new token looked."""
    weights = attention_by_position(view)
    names = [visible(piece.text) for piece in pieces][:len(weights)]
    names += [f"#{i}" for i in range(len(names), len(weights))]  # a view on its own has no texts
    cells = "".join(_attention_cell(name, w) for name, w in zip(names, weights, strict=True))
    attention = ("<style>.tbt-att{display:inline-block;border:1px solid var(--tbt-rule);border-radius:3px;"
                 "padding:0 .2em;margin:1px;font-family:ui-monospace,monospace;white-space:pre}</style>"
                 + heading_html("Attention of the new token", "Averaged over every layer and head; the "
                                "darker, the more of its attention lands there (hover for the share).")
                 + f"<div>{cells}</div>")
    lens = heading_html(f"Inside step {view.step}'s forward pass", esc(pass_text(view, pick)))
    return block(lens + lens_cells_html(view, pick, pick.token_id) + attention)


@dataclass(frozen=True)
class Html:
    """HTML that a notebook shows as the value of a cell."""

    text: str

    def _repr_html_(self) -> str:
        return self.text


def show_inside(gen: Generation, index: int | None = None) -> Html:
    """Inside step `index`'s pass (the latest if None), its pick and context named from the
    generation (the engine repeats the pass if `gen.inside` was off, and checks its logits)."""
    view = gen.inside_view(index)
    record = gen.steps[view.step - 1]
    pieces = [*gen.prompt_pieces, *(step.token for step in gen.steps)][:view.position + 1]
    return Html(inside_html(view, record.token, pieces))


def round_html(record: RoundRecord, texts: object) -> str:
    """One speculative round: the guesses and their verdicts, every distribution of the one
    verify pass, and what replaced a rejected guess."""
    body = round_line_html(record) + positions_html(record)
    if record.rejection is not None:
        body += rejection_html(record, texts)
    return block(body)


def speculative_html(gen: SpeculativeGeneration) -> str:
    """A speculative generation: its context underlined round by round, and the latest round."""
    chips = speculative_chips_html(prompt_chips(gen.prompt_pieces), gen)
    latest = gen.rounds[-1] if gen.rounds else None
    return block(chips) + (round_html(latest, gen.lm.texts) if latest else "")


def enable(shell: object | None = None) -> bool:
    """Draw the engine's records as HTML in this IPython shell (the running one if not given);
    False outside IPython. Called when ui.notebook is imported."""
    if shell is None:
        try:
            from IPython import get_ipython  # only in a notebook: the app never imports this module
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    html = shell.display_formatter.formatters["text/html"]
    html.for_type(StepRecord, step_html)
    html.for_type(Generation, generation_html)
    html.for_type(SpeculativeGeneration, speculative_html)
    html.for_type(RoundRecord, lambda record: round_html(record, RoundTexts(record)))
    html.for_type(InsideView, lambda view: inside_html(view, lens_pick(view), ()))
    return True


@dataclass(frozen=True)
class RoundTexts:
    """The texts of the tokens a round record names (its guesses and what it added)."""

    record: RoundRecord

    def piece(self, token_id: int) -> TokenPiece:
        for piece in (*self.record.drafted, *self.record.emitted):
            if piece.token_id == token_id:
                return piece
        raise KeyError(f"token {token_id} is not among round {self.record.index}'s tokens")


# The pick of an InsideView on its own (a layer's LayerView holds the pick's rank, not its id):
# the top token of a layer where it ranks first; where it never does, no cell is marked and the
# words say it never led.
UNNAMED_PICK = TokenPiece(-1, "the step's pick", special=False, partial_bytes=False)


def lens_pick(view: InsideView) -> TokenPiece:
    leading = [layer for layer in view.layers if layer.pick_rank == 1]
    if not leading:
        return UNNAMED_PICK
    return TokenPiece(leading[-1].top_token_id, leading[-1].top_text, special=False, partial_bytes=False)
