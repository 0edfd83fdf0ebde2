"""Token by Token: the frame. Page config, the shared sidebar (model, presentation mode), navigation."""

from __future__ import annotations

import streamlit as st

import ui  # noqa: F401  first: it sets OpenMP's wait policy, which OpenMP reads once, when torch loads

# isort: split
from engine import SettingsError
from ui.server import current_deployment, current_model, switch_model
from ui.session import APP
from ui.views import plain, theme_css
from ui.widgets import app_pages, mark_framed_run

st.set_page_config(page_title="Token by Token", page_icon="🔤", layout="wide")
st.html(theme_css())  # the custom HTML's colours for the visitor's light or dark theme

try:
    current_deployment()
except SettingsError as exc:  # a mistyped TBT_* variable: say which, serve nothing else
    st.error(plain(f"This server's deployment settings cannot be used: {exc}"), icon=":material/error:")
    st.stop()


def model_sidebar() -> None:
    """Which model every page runs on, with a field to load another."""
    with st.sidebar:
        st.markdown("### Model")
        lm = current_model()
        st.markdown(f"**{lm.name}**  \n{lm.parameters / 1e6:.0f} M parameters · "
                    f"{lm.vocab_size:,} tokens · context {lm.context_window:,}  \n"
                    f"device **{lm.device}** · dtype **{str(lm.dtype).removeprefix('torch.')}**"
                    + (f" · loaded in {lm.load_seconds:.1f} s" if lm.load_seconds else ""))
        deployment = current_deployment()
        if deployment.model_field:
            with st.form(APP.model_form, border=False):
                source = st.text_input("Load another model", key=APP.model_field,
                                       placeholder="Hub id, model folder, or .gguf path",
                                       help="Empty = the bundled SmolLM2-135M-Instruct. A Hub id needs a network; "
                                            "a GGUF file is dequantised on its first load.")
                if st.form_submit_button("Load model"):
                    switch_model(source)
        else:
            st.caption(f"This server runs {', '.join(deployment.allowed_models or ('any model',))}; visitors "
                       "cannot load others.")
        if APP.model_error in st.session_state:
            st.error(plain(st.session_state[APP.model_error] + " The previous model stays loaded."),
                     icon=":material/back_hand:")
        st.divider()
        st.toggle("Presentation mode", key=APP.presentation, persist_state="session",
                  help="Large type and fewer panels, for a projector.")


navigation = st.navigation(app_pages())
mark_framed_run()
model_sidebar()
navigation.run()
