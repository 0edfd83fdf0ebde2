"""One controller per page, named as its page file is: plain functions over a visitor's state
(a MutableMapping: st.session_state in the app, a dict in tests) that run the engine and leave in
that state what the page shows. No Streamlit here (tests/ui/test_layering.py). A page names its
controller by its module: `from ui.controllers import sampler_lab as lab`.
"""

from ui import room_exports

__getattr__, __all__ = room_exports(__name__, {
    "breaking_the_chain": (),
    "class_room": (),
    "determinism": (),
    "kv_speed": (),
    "lesson": (),
    "sampler_lab": (),
    "step_through": (),
})
