"""Token by Token's engine: a real autoregressive decode loop that records every number a
visualizer needs. No Streamlit here; usable from notebooks and the command line.

    from engine import Generation, SamplerSettings, StopSettings, load_model

    lm = load_model()  # the bundled SmolLM2-135M-Instruct
    gen = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0))
    step = gen.step()
    print(step.token.text, step.prob)  # ' Paris' 0.77...

This package is the loop and its stages; two sub-packages hold the rest, each with its own
public names: `engine.speculative` (several tokens per forward pass, the same output) and
`engine.serving` (one model shared by many visitors: the scheduler and its packed passes,
loaded only by a server). `engine.speed` measures what a step costs; `proof_decisions()` lists
which fast paths (engine/fast) the probes proved on this machine, and why not; `check_sampler`
and `check_stop` run a student's own sampler or stop rule beside the engine's. See
ARCHITECTURE.md.
"""

from engine.checker import CheckReport, StudentCodeError, check_sampler, check_stop, load_student
from engine.cpu_threads import on_sampler_thread
from engine.errors import GenerationFinished, ModelLoadError, PromptError, SettingsError, TraceError, shown
from engine.fast import Proof, proof_decisions
from engine.generation import (
    Candidate,
    Distribution,
    Generation,
    PromptReading,
    Resampled,
    StepRecord,
    Timing,
    describe_distribution,
)
from engine.inside import InsideView, LayerView, prepare_inside
from engine.kvcache import KVGeometry, KVSnapshot
from engine.limits import Limits
from engine.loading import BUNDLED, LoadedModel, ModelSource, load_model, resolve_source
from engine.prompt import build_prompt
from engine.recording import recording_html, trace_from_recording
from engine.sampling import (
    ChainOutput,
    Decision,
    Draw,
    InverseCdf,
    StageRecord,
    decide,
    draw_uniform,
    pick_by_cdf,
    run_chain,
)
from engine.settings import CHAINS, SamplerSettings, StopSettings
from engine.shell import GenerationShell, PassQueue
from engine.slide import SLIDE_SIZES, step_slide
from engine.speculative import DraftModel, PromptLookup, RoundRecord, SpeculativeGeneration, self_draft
from engine.stopping import (
    FINISH_REASONS,
    StopSequenceState,
    Termination,
    escape,
    first_match,
    stop_sequence_states,
    unescape,
)
from engine.tokens import VISIBLE, TokenPiece, TokenTexts, visible
from engine.trace import (
    TRACE_FORMAT,
    TRACE_VERSION,
    Replay,
    TraceText,
    catch_up,
    generation_recording,
    generation_slide,
    load_trace,
    other_device_note,
    parse_trace,
    replay,
    save_recording,
    save_trace,
    to_trace,
)

__all__ = [
    "BUNDLED", "CHAINS", "FINISH_REASONS", "SLIDE_SIZES", "TRACE_FORMAT", "TRACE_VERSION", "VISIBLE", "Candidate",
    "ChainOutput", "CheckReport", "Decision", "Distribution", "DraftModel", "Draw", "Generation",
    "GenerationFinished", "GenerationShell", "InsideView", "InverseCdf", "KVGeometry", "KVSnapshot", "LayerView",
    "Limits", "LoadedModel", "ModelLoadError", "ModelSource", "PassQueue", "PromptError", "PromptLookup",
    "PromptReading", "Proof", "Replay", "Resampled", "RoundRecord", "SamplerSettings", "SettingsError",
    "SpeculativeGeneration", "StageRecord", "StepRecord", "StopSequenceState", "StopSettings", "StudentCodeError",
    "Termination", "Timing", "TokenPiece", "TokenTexts", "TraceError", "TraceText", "build_prompt", "catch_up",
    "check_sampler", "check_stop", "decide", "describe_distribution", "draw_uniform", "escape", "first_match",
    "generation_recording", "generation_slide", "load_model", "load_student", "load_trace", "on_sampler_thread",
    "other_device_note", "parse_trace", "pick_by_cdf", "prepare_inside", "proof_decisions", "recording_html",
    "replay", "resolve_source", "run_chain", "save_recording", "save_trace", "self_draft", "shown", "step_slide",
    "stop_sequence_states", "to_trace", "trace_from_recording", "unescape", "visible",
]
