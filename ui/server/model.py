"""The shared model: one cached load per (source, device, dtype), chosen per visitor."""

from __future__ import annotations

import gc
import logging

import streamlit as st

from engine import BUNDLED, LoadedModel, ModelLoadError, load_model, prepare_inside
from engine.serving import ForwardScheduler, batching_from_env
from ui.server.deployment import current_deployment
from ui.session.keys import APP
from ui.views.format import plain


@st.cache_resource(show_spinner=False)
def _engine_log() -> logging.Logger:
    """The engine's decisions (which pass a lone step takes, a kernel that could not be built)
    said once each in the server's log, at INFO and above: Python logs only warnings unless told."""
    log = logging.getLogger("engine")
    log.setLevel(logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    return log


@st.cache_resource(show_spinner=False, max_entries=4)
def _load_shared(source: str, device: str | None) -> LoadedModel:
    """Read-only and shared by every visitor; per-visitor state lives in session_state."""
    _engine_log()
    lm = load_model(None if source == BUNDLED else source, device=device)
    prepare_inside(lm)  # the lens kernel built at start, not in the first visitor's look inside
    # torch, transformers and the model are hundreds of thousands of long-lived Python objects:
    # a full garbage collection walking them is a visible stall mid-click. Frozen, they are skipped
    # (collected first, so no garbage from the load is frozen with them).
    gc.collect()
    gc.freeze()
    return lm


def _close_scheduler(scheduler: ForwardScheduler) -> None:
    scheduler.close()


@st.cache_resource(show_spinner=False, max_entries=4, on_release=_close_scheduler)
def _shared_scheduler(source: str, device: str | None) -> ForwardScheduler:
    """One queue for the forward passes of every visitor on this model: one pass at a time,
    the waiting decode steps batched into one as the server's TBT_BATCHING says (exact by default)."""
    return ForwardScheduler(_load_shared(source, device), batching=batching_from_env())


def current_scheduler() -> ForwardScheduler:
    """The forward-pass scheduler every visitor on the current model shares."""
    return _shared_scheduler(current_source(), None)


def current_source() -> str:
    return st.session_state.get(APP.model_source, BUNDLED)


def current_model() -> LoadedModel:
    """The visitor's model, loading it (with a spinner) the first time anyone asks."""
    source = current_source()
    with st.spinner(f"Loading {'the bundled model' if source == BUNDLED else plain(source)}…"):
        return _load_shared(source, None)


def switch_model(source: str) -> bool:
    """Try another model; on failure keep the current one and remember the message."""
    source = source.strip() or BUNDLED
    deployment = current_deployment()
    try:
        deployment.check_model(source)  # before anything on the server is read
        with st.spinner(f"Loading {plain(source)}… (a GGUF file is dequantised on first load)"):
            _load_shared(source, None)
    except ModelLoadError as exc:
        st.session_state[APP.model_error] = deployment.describe_error(exc)
        return False
    st.session_state[APP.model_source] = source
    st.session_state.pop(APP.model_error, None)
    return True


def shared_model_and_scheduler(source: str) -> tuple[LoadedModel, ForwardScheduler]:
    """The shared model `source` and its queue, whoever this visitor is (the Class page's rooms
    all run on the bundled model, whatever model a visitor's sidebar has chosen)."""
    with st.spinner("Loading the bundled model…" if source == BUNDLED else f"Loading {plain(source)}…"):
        return _load_shared(source, None), _shared_scheduler(source, None)
