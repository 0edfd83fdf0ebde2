"""Token by Token: the frame. Page config, the shared sidebar (model), navigation."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from ui.model import ERROR_KEY, current_model, switch_model

HERE = Path(__file__).parent

st.set_page_config(page_title="Token by Token", page_icon="🔤", layout="wide")


def model_sidebar() -> None:
    """Which model every page runs on, with a field to load another."""
    with st.sidebar:
        st.markdown("### Model")
        lm = current_model()
        st.markdown(f"**{lm.name}**  \n{lm.parameters / 1e6:.0f} M parameters · "
                    f"{lm.vocab_size:,} tokens · context {lm.context_window:,}  \n"
                    f"device `{lm.device}` · dtype `{str(lm.dtype).removeprefix('torch.')}`")
        with st.form("model_form", border=False):
            source = st.text_input("Load another model", key="model_field",
                                   placeholder="Hub id, model folder, or .gguf path",
                                   help="Empty = the bundled SmolLM2-135M-Instruct. A Hub id needs a network.")
            if st.form_submit_button("Load model"):
                switch_model(source)
        if ERROR_KEY in st.session_state:
            st.error(st.session_state[ERROR_KEY] + " The previous model stays loaded.")


pages = [
    st.Page(HERE / "pages" / "step_through.py", title="Step through", icon="▶️", default=True),
    st.Page(HERE / "pages" / "sampler_lab.py", title="Sampler lab", icon="🎛️"),
    st.Page(HERE / "pages" / "kv_speed.py", title="KV cache & speed", icon="⚡"),
    st.Page(HERE / "pages" / "lesson.py", title="Lesson", icon="🎓"),
]
navigation = st.navigation(pages)
model_sidebar()
navigation.run()
