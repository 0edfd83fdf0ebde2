"""What a page computes from the engine with no visitor state and no drawing: the Sampler lab's
numbers, the Lesson's presets and the scoring of its exercise, Breaking the chain's lanes, draft
methods and cost figures. No Streamlit here; controllers and views both use it.
"""

from ui import room_exports

__getattr__, __all__ = room_exports(__name__, {
    "breaking_the_chain": ("CostFigures", "Counts", "Lanes", "cost_figures", "counts", "plain_ms_per_token"),
    "lesson": ("PREDICT_PROMPTS", "PRESETS", "STAGES", "Guess", "candidates", "tally"),
    "sampler_lab": (
        "FrozenStep", "Outcome", "apply", "chain_outcomes", "disputed_tokens", "min_p_sweep", "nucleus_sweep",
        "outcome_distribution", "temperature_sweep",
    ),
})
