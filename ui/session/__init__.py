"""Session plumbing, one visitor's own: the session-state keys of every page, settings read from a
page's widgets and the messages beside its controls, bounded memos, share links, presets, and the
rebuild of what the idle releaser put away, and the clock of a page's Run.
"""

from ui import room_exports

__getattr__, __all__ = room_exports(__name__, {
    "idle_rebuild": (),
    "keys": ("APP", "CHAIN", "CLASS", "DETERMINISM", "KV", "LAB", "LESSON", "STEP"),
    "memo": ("remember",),
    "presets": ("CHAIN_PRESETS_FILE", "load_presets", "preset_named"),
    "run_clock": ("RunClock",),
    "settings": (
        "DETAIL_VIEWS", "Message", "init_defaults", "message", "notice", "set_message", "slider_range",
        "step_generation", "widget_range",
    ),
    "share": (),
})
