"""Token by Token's engine: a real autoregressive decode loop that records every number a
visualizer needs. No Streamlit here; usable from notebooks and the command line.

    from engine import Generation, SamplerSettings, StopSettings, load_model

    lm = load_model()  # the bundled SmolLM2-135M-Instruct
    gen = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0))
    step = gen.step()
    print(step.token.text, step.prob)  # ' Paris' 0.77...
"""

from engine.drafting import DraftModel, PromptLookup, self_draft
from engine.errors import GenerationFinished, ModelLoadError, PromptError, SettingsError, TraceError
from engine.generation import Candidate, Distribution, Generation, Resampled, StepRecord, Timing
from engine.kvcache import KVGeometry, KVSnapshot
from engine.loading import LoadedModel, ModelSource, load_model, resolve_source
from engine.sampling import Decision, Draw, StageRecord
from engine.settings import CHAINS, SamplerSettings, StopSettings
from engine.speculative import RoundRecord, SpeculativeGeneration
from engine.stopping import FINISH_REASONS, StopSequenceState, Termination
from engine.trace import Replay, load_trace, parse_trace, replay, save_trace, to_trace

__all__ = [
    "CHAINS", "FINISH_REASONS", "Candidate", "Decision", "Distribution", "DraftModel", "Draw", "Generation",
    "GenerationFinished", "KVGeometry", "KVSnapshot", "LoadedModel", "ModelLoadError", "ModelSource",
    "PromptError", "PromptLookup", "Replay", "Resampled", "RoundRecord", "SamplerSettings", "SettingsError",
    "SpeculativeGeneration", "StageRecord", "StepRecord", "StopSequenceState", "StopSettings", "Termination",
    "Timing", "TraceError", "load_model", "load_trace", "parse_trace", "replay", "resolve_source", "save_trace",
    "self_draft", "to_trace",
]
