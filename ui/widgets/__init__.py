"""What draws with Streamlit: the panels that show a Generation, the app's frame and navigation,
presentation mode, the KV page's live view of the server and the Class page's follow signal. Each
takes what it shows from the views and draws it; the page decides the layout.
"""

from ui import room_exports

__getattr__, __all__ = room_exports(__name__, {
    "follow": ("follow_view",),
    "frame": ("app_pages", "ensure_app_frame", "mark_framed_run"),
    "kv_speed": ("server_batching",),
    "notices": ("show_notice",),
    "panels": ("described_chart", "html"),
    "run": ("continue_run",),
    "theme": ("current_theme",),
    "presentation": (
        "BACKWARD", "EMBED_ROWS", "FORWARD", "RUN", "embedded", "page_style", "presenter_keys", "presenting",
    ),
})
