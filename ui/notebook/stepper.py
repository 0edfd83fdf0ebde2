"""The Stepper: one generation stepped from a notebook cell with buttons and sliders (anywidget),
on the real model. Python keeps the generation and draws it (ui/notebook/display.py); the
browser side (stepper.js) only sends what was pressed. Where widgets do not run (nbviewer,
GitHub), the cell shows the generation as it was when the cell ran.

anywidget because one widget file then runs in Jupyter, JupyterLab, Colab, VS Code and marimo
with nothing to build or install beyond the package (ipywidgets' own custom widgets need a
front-end extension per host).
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets

from engine import Generation, GenerationFinished, LoadedModel, PromptError, SamplerSettings, SettingsError
from ui.notebook.display import NOTEBOOK_CSS, generation_html

HERE = Path(__file__).parent
STEPPER_CSS = """
.tbt-stepper{font-family:inherit;color:inherit}
.tbt-stepper:focus-visible{outline:2px solid #e67700;outline-offset:4px}
.tbt-stepper textarea{width:100%;max-width:980px;box-sizing:border-box;font:inherit;font-family:ui-monospace,monospace}
.tbt-stepper .tbt-buttons{display:flex;gap:.5rem;align-items:center;margin:.4rem 0}
.tbt-stepper button{font:inherit;padding:.25rem .9rem;border-radius:6px;border:1px solid currentColor;
 background:transparent;color:inherit;cursor:pointer}
.tbt-stepper button[data-do=step]{background:#9e303b;color:#fff;border-color:#9e303b}
.tbt-stepper button:focus-visible,.tbt-stepper input:focus-visible,.tbt-stepper textarea:focus-visible
 {outline:2px solid #e67700;outline-offset:2px}
.tbt-stepper .tbt-sliders{display:flex;flex-wrap:wrap;gap:.4rem 1.2rem;margin-bottom:.4rem}
.tbt-stepper .tbt-slider{display:flex;flex-direction:column;min-width:180px}
.tbt-stepper.tbt-busy .tbt-view{opacity:.6}
"""


class Stepper(anywidget.AnyWidget):
    """A generation to step from a notebook: Step / Back / Reset, the sampler's sliders (they
    apply from the next step on) and a prompt box (read at Reset).

        from engine import load_model
        from ui.notebook import Stepper
        Stepper(load_model(), "The capital of France is")
    """

    _esm = HERE / "stepper.js"
    _css = STEPPER_CSS

    prompt = traitlets.Unicode("").tag(sync=True)
    temperature = traitlets.Float(0.0).tag(sync=True)
    top_k = traitlets.Int(0).tag(sync=True)
    top_p = traitlets.Float(1.0).tag(sync=True)
    min_p = traitlets.Float(0.0).tag(sync=True)
    view = traitlets.Unicode("").tag(sync=True)
    status = traitlets.Unicode("").tag(sync=True)
    busy = traitlets.Bool(False).tag(sync=True)

    def __init__(self, lm: LoadedModel, prompt: str = "The capital of France is", *,
                 sampler: SamplerSettings | None = None, seed: int = 0, chat: bool = False) -> None:
        sampler = sampler or SamplerSettings(temperature=0)
        super().__init__(prompt=prompt, temperature=sampler.temperature, top_k=sampler.top_k, top_p=sampler.top_p,
                         min_p=sampler.min_p)
        self.lm, self.seed, self.chat = lm, seed, chat
        self.gen = Generation(lm, prompt, sampler=sampler, seed=seed, chat=chat)
        self.on_msg(self._pressed)
        self.observe(self._sliders_moved, names=["temperature", "top_k", "top_p", "min_p"])
        self.observe(self._prompt_typed, names=["prompt"])
        self._redraw("Press Step to make the first token.")

    # ---- what the buttons do (also callable from Python) ----------------------------------

    def step(self) -> None:
        """Make the next token, unless the generation has finished."""
        if self.gen.finished:
            self._redraw(f"Finished ({self.gen.finish_reason}): Back, or Reset to start again.")
            return
        self._busy(lambda: self.gen.step())
        self._redraw(f"Step {len(self.gen.steps)}.")

    def back(self) -> None:
        """Take the latest token back (its step is rewound; Step makes it again)."""
        if not self.gen.steps:
            self._redraw("Nothing to take back: no step yet.")
            return
        self.gen.rewind(len(self.gen.steps) - 1)
        self._redraw(f"Back to step {len(self.gen.steps)}.")

    def reset(self) -> None:
        """Start again from the prompt box's text with the sliders' settings."""
        try:
            gen = Generation(self.lm, self.prompt, sampler=self._sampler(), seed=self.seed, chat=self.chat)
        except (PromptError, SettingsError) as exc:
            self._redraw(f"Not reset: {exc}")
            return
        self.gen.close()
        self.gen = gen
        self._redraw("Reset: press Step.")

    # ---- the browser side's messages and settings -----------------------------------------

    def _pressed(self, _widget: object, content: dict, _buffers: object) -> None:
        action = {"step": self.step, "back": self.back, "reset": self.reset}.get(content.get("do"))
        if action is not None:
            action()

    def _sampler(self) -> SamplerSettings:
        return SamplerSettings(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    def _sliders_moved(self, _change: dict) -> None:
        try:
            self.gen.sampler = self._sampler()
        except SettingsError as exc:
            self._redraw(f"Those settings cannot be used: {exc}. The previous ones stay.")
            return
        self._redraw("New settings: they apply from the next Step.")

    def _prompt_typed(self, _change: dict) -> None:
        if self.prompt != self.gen.prompt:
            self._redraw("Press Reset to start from the new prompt.")

    def _busy(self, work: object) -> None:
        self.busy = True
        try:
            work()
        except GenerationFinished as exc:
            self.status = str(exc)
        finally:
            self.busy = False

    def _redraw(self, status: str) -> None:
        self.view = generation_html(self.gen)
        self.status = status

    # ---- where widgets do not run -----------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: object) -> tuple[dict, dict] | None:
        """The widget, and the generation as it is now as HTML for readers without widgets."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        note = ('<p class="tbt-recorded">A still of the Stepper when this cell ran: open the notebook in '
                "Jupyter, JupyterLab, Colab or VS Code to step it.</p>")
        data["text/html"] = f"<style>{STEPPER_CSS}</style>{NOTEBOOK_CSS}{note}{self.view}"
        return data, metadata
