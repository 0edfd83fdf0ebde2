"""The notebook form: the engine's records drawn in Jupyter, JupyterLab, Colab and VS Code as
the app draws them, and a Stepper widget on the real model. Nothing here runs in the app, and the
engine never imports it.

    import ui.notebook  # from now on a step, a generation, a round or a look inside draws itself
    from ui.notebook import Stepper, show_inside

Importing the room registers the HTML formatters with the running IPython (display.enable).
"""

from ui import room_exports
from ui.notebook.display import enable

__getattr__, __all__ = room_exports(__name__, {
    "display": ("NOTEBOOK_CSS", "generation_html", "inside_html", "round_html", "show_inside", "speculative_html",
                "step_html"),
    "stepper": ("Stepper",),
})
__all__ = [*__all__, "enable"]

enable()
