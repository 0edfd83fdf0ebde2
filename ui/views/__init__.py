"""Pure views: HTML strings and Plotly figures made from engine records, and the formatting and
colours they share. No Streamlit and no controllers here (tests/ui/test_layering.py), so tests
read what a visitor sees without a browser.
"""

from ui import room_exports

__getattr__, __all__ = room_exports(__name__, {
    "bars": ("Bar", "BarRow", "bars_html", "distribution_bars_html"),
    "breaking_the_chain": (
        "counted", "kv_html", "method_note", "no_guess_reason", "positions_html", "rejection_html",
        "round_line_html", "rounds_table_html", "speculative_chips_html", "speed_verdict", "verify_cost_text",
        "verify_path_text",
    ),
    "chain_story": ("CostSummary", "RoundStory", "race_cost_text", "race_table", "race_verdict"),
    "charts": ("RAW_COLOUR",),
    "chips": ("chip_window", "context_html", "prompt_chips"),
    "class_room": (),
    "determinism": (
        "closest_calls", "kernel_lines", "precision_line", "product_line", "sampled_closest",
        "step_figure", "step_table", "sum_line", "texts_html", "verdict",
    ),
    "draft_pictures": ("draft_picture_html",),
    "format": ("chain_name", "esc", "nbytes", "pct", "plain", "quoted"),
    "inside": (),
    "kv_speed": ("batch_one_text", "bound_text", "memory_bound", "reads_text"),
    "prefill": ("long_prompt_warning", "reading_progress"),
    "records": ("FINISH_LABELS", "LINE_CSS", "PANEL_CSS"),
    "teaching_charts": (
        "batch_figure", "cache_figure", "chains_figure", "cut_figure", "draws_figure", "kv_memory_figure",
        "prefill_decode_figure", "ratio_figure", "roofline_figure", "settings_figure", "temperature_figure",
        "token_labels", "top_values_figure",
    ),
    "theme": ("theme_css",),
})
