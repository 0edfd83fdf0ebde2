"""Every session_state key the app uses, one documented set per page.

Each page owns a prefix, so two pages never share a key by accident and a key found in
st.session_state says which page wrote it: `app_` for the frame (app.py and what every page
shares), `st_` for Step through, `lab_` for the Sampler lab, `kv_` for KV cache & speed, `lesson_`
for the Lesson, `bc_` for Breaking the chain, `det_` for Same prompt, different answers and `cls_`
for the Class. Widget keys are here too: a
widget's key is its value's key in session_state. Pages and ui/ use these names, never string
literals (tests/ui/test_keys.py checks both rules).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar


@dataclass(frozen=True)
class PageKeys:
    """One page's keys; every one starts with the page's prefix."""

    prefix: ClassVar[str]

    def names(self) -> tuple[str, ...]:
        """Every key (and key prefix) of this page."""
        return tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class AppKeys(PageKeys):
    """The frame: the model sidebar, presentation mode, the first-run frame check."""

    prefix: ClassVar[str] = "app_"
    model_source: str = "app_model_source"  # what this visitor's pages run on
    model_error: str = "app_model_error"  # why the last model switch failed
    model_form: str = "app_model_form"
    model_field: str = "app_model_field"
    presentation: str = "app_presentation"  # the sidebar's presentation-mode toggle
    exit_presentation: str = "app_exit_presentation"  # presentation mode's own way out (the sidebar is hidden)
    frame_checked: str = "app_frame_checked"  # ui/widgets/frame.py: this visitor's first run was checked
    presentation_bar: str = "app_presentation_bar"  # presentation mode's corner: the pages and the way out
    framed_run: str = "app_framed_run"  # ui/widgets/frame.py: this run came through app.py (which set it)


@dataclass(frozen=True)
class StepKeys(PageKeys):
    """Step through: the setup and sampler widgets, the visitor's Generation, the Run."""

    prefix: ClassVar[str] = "st_"
    # setup widgets (their values make the generation: ui/session/settings.py)
    prompt: str = "st_prompt"
    preset: str = "st_preset"
    chat: str = "st_chat"
    allow_special: str = "st_allow_special"  # chat mode: let typed special-token text through
    seed: str = "st_seed"
    max_new_tokens: str = "st_max_new_tokens"
    stop_sequences: str = "st_stop_sequences"
    ignore_eos: str = "st_ignore_eos"
    # sampler widgets
    temperature: str = "st_temperature"
    top_k: str = "st_top_k"
    top_p: str = "st_top_p"
    min_p: str = "st_min_p"
    repetition_penalty: str = "st_repetition_penalty"
    chain: str = "st_chain"
    # view widgets
    chart_mode: str = "st_chart_mode"
    sequence_basis: str = "st_sequence_basis"
    tabs: str = "st_tabs"
    distribution_chart: str = "st_distribution_chart"
    kv_chart: str = "st_kv_chart"
    history: str = "st_history"
    # buttons (the browser tests and AppTests find them by these keys)
    step: str = "st_step"
    run: str = "st_run"  # Run, and Stop while a Run goes on
    back: str = "st_back"
    reset: str = "st_reset"
    repick: str = "st_repick"
    force_prefix: str = "st_force_"  # + step index _ pick: the branch pills (a new widget for each pick)
    trace_download: str = "st_trace_download"
    recording_download: str = "st_recording_download"
    slide_download: str = "st_slide_download_"  # prefix: one button per slide size
    trace_upload: str = "st_trace_upload"
    replay_stop: str = "st_replay_stop"  # shown while a link or a trace replays: any click cancels it
    # fragments (a branch or a re-pick reruns the workspace; a sampler control the sampler view)
    workspace: str = "st_workspace"
    sampler_view: str = "st_sampler"
    # state no widget owns
    generation: str = "st_generation"  # the visitor's Generation: read it with ui.session.settings.step_generation
    messages: str = "st_messages"  # control name -> message shown beside that control
    running: str = "st_running"
    awaiting_prompt: str = "st_awaiting_prompt"  # Step pressed while a long prompt's pass is still reading
    run_frame_started: str = "st_run_frame_started"  # when the Run's current token began
    link_read: str = "st_link_read"  # the share link in the address was read (first run only)
    memo: str = "st_memo"  # ui/session/memo.py store: prompt chips, re-sampled steps, inside views
    inside_head: str = "st_inside_head"  # the attention heatmap's head (or the mean)
    inside_table: str = "st_inside_table"
    inside_attention: str = "st_inside_attention"
    inside_times: str = "st_inside_times"
    inside_screen: str = "st_inside_screen"  # presentation mode: inside the pass in place of the distribution


@dataclass(frozen=True)
class LabKeys(PageKeys):
    """Sampler lab: the frozen step's source, three sampler columns, sweeps, chains, draws."""

    prefix: ClassVar[str] = "lab_"
    source: str = "lab_source"
    own_draw: str = "lab_own_draw"
    u: str = "lab_u"
    column_a: str = "lab_a"  # + "_temperature", "_top_k", ...: one sampler column's sliders
    column_b: str = "lab_b"
    column_c: str = "lab_c"
    settings_chart: str = "lab_settings_chart"
    draw_sampler: str = "lab_draw_sampler"
    draw_seed: str = "lab_draw_seed"
    draw_button: str = "lab_draw_button"
    draws_chart: str = "lab_draws_chart"
    sweep_temperature: str = "lab_sweep_temperature"
    sweep_top_p: str = "lab_sweep_top_p"
    sweep_min_p: str = "lab_sweep_min_p"
    temperature_chart: str = "lab_temperature_chart"
    top_p_chart: str = "lab_top_p_chart"
    min_p_chart: str = "lab_min_p_chart"
    chain_temperature: str = "lab_chain_temperature"
    chain_top_k: str = "lab_chain_top_k"
    chain_top_p: str = "lab_chain_top_p"
    chain_min_p: str = "lab_chain_min_p"
    chain_chart: str = "lab_chain_chart"
    # ui/session/memo.py stores: costly results (frozen steps, sweeps, the 1,000 draws) apart from
    # cheap ones (charts, chain outcomes), so reading off many values never evicts the draws
    memo: str = "lab_memo"
    views: str = "lab_views"
    messages: str = "lab_messages"  # control name -> message shown beside that control


@dataclass(frozen=True)
class KVKeys(PageKeys):
    """KV cache & speed: the measurements taken and the controls that ask for more."""

    prefix: ClassVar[str] = "kv_"
    results: str = "kv_results"  # ui/session/memo.py store: measurements by (model, device, tier, what)
    tier: str = "kv_tier"
    more: str = "kv_more"
    again: str = "kv_again"
    taken: str = "kv_taken"  # the shared measurements this visitor shows, with when they were taken
    positions: str = "kv_positions"
    cache_chart: str = "kv_cache_chart"
    ratio_chart: str = "kv_ratio_chart"
    prefill_chart: str = "kv_prefill_chart"
    memory_chart: str = "kv_memory_chart"
    roofline_chart: str = "kv_roofline_chart"
    batch_chart: str = "kv_batch_chart"
    live_batches: str = "kv_live_batches"  # the server's scheduler, live: its latest passes' batch sizes


@dataclass(frozen=True)
class LessonKeys(PageKeys):
    """Lesson: the guided walk and the predict-then-reveal exercise."""

    prefix: ClassVar[str] = "lesson_"
    mode: str = "lesson_mode"
    # the guided walk
    preset: str = "lesson_preset"
    walk: str = "lesson_walk"  # ((preset name, model name), Generation)
    link_read: str = "lesson_link_read"  # the address's preset and stage were read (first run only)
    stage: str = "lesson_stage"  # the screen shown
    previous: str = "lesson_previous"
    next: str = "lesson_next"
    restart: str = "lesson_restart"
    run: str = "lesson_run"
    logits_chart: str = "lesson_logits_chart"
    probs_chart: str = "lesson_probs_chart"
    inside_chart: str = "lesson_inside_chart"  # the inside stage's attention heatmap
    memo: str = "lesson_memo"  # ui/session/memo.py store: the inside views of the walk's steps
    walk_messages: str = "lesson_walk_messages"  # control name -> message shown beside that control
    # the prediction exercise
    predict_prompt: str = "lesson_predict_prompt"
    predict: str = "lesson_predict"  # ((prompt, model name), Generation)
    guesses: str = "lesson_guesses"
    revealed: str = "lesson_revealed"
    guess_prefix: str = "lesson_guess_"  # + the step index: that round's choice
    reveal: str = "lesson_reveal"
    next_round: str = "lesson_next_round"
    reveal_chart: str = "lesson_reveal_chart"
    predict_messages: str = "lesson_predict_messages"  # as walk_messages, for the exercise


@dataclass(frozen=True)
class ChainKeys(PageKeys):
    """Breaking the chain: the setup widgets, the two lanes, the Run, the measurements."""

    prefix: ClassVar[str] = "bc_"
    # setup widgets (their values make the lanes: ui/controllers/breaking_the_chain.py)
    prompt: str = "bc_prompt"
    chat: str = "bc_chat"
    preset: str = "bc_preset"
    method: str = "bc_method"  # the draft method the widget asks for
    k: str = "bc_k"
    temperature: str = "bc_temperature"
    top_k: str = "bc_top_k"
    top_p: str = "bc_top_p"
    min_p: str = "bc_min_p"
    repetition_penalty: str = "bc_repetition_penalty"
    max_new_tokens: str = "bc_max_new_tokens"
    stop_sequences: str = "bc_stop_sequences"
    seed: str = "bc_seed"
    # buttons (the browser tests and AppTests find them by these keys)
    step: str = "bc_step"
    run: str = "bc_run"  # Run, and Stop while a Run goes on
    reset: str = "bc_reset"
    measure: str = "bc_measure"
    trace_download: str = "bc_trace_download"
    trace_upload: str = "bc_trace_upload"
    race: str = "bc_race"  # every method on the prompt, one after another
    race_rows: str = "bc_race_rows"  # the race's measured rows (engine/speculative/race.py RaceRow)
    race_job: str = "bc_race_job"  # the race running on its own thread (engine/speculative/race.py RaceJob)
    race_table: str = "bc_race_table"
    # fragments
    workspace: str = "bc_workspace"
    # state no widget owns
    lanes: str = "bc_lanes"  # the visitor's two generations (ui/domain/breaking_the_chain.py Lanes)
    messages: str = "bc_messages"  # control name -> message shown beside that control
    running: str = "bc_running"
    run_frame_started: str = "bc_run_frame_started"  # when the Run's current round began
    active_method: str = "bc_active_method"  # the method the speculative lane drafts with now
    measured: str = "bc_prefill_decode"  # the prefill-against-decode measurement asked for
    memo: str = "bc_memo"  # ui/session/memo.py store: prompt chips


@dataclass(frozen=True)
class ClassKeys(PageKeys):
    """Class: the lobby, the presenter's room (the Step page's keys under `presenter`), a student's view."""

    prefix: ClassVar[str] = "cls_"
    presenter: str = "cls_p_"  # prefix: the presenter's Step-page widgets and state (ui/controllers/class_room.py)
    role: str = "cls_role"  # "presenter" or "student", decided on the server
    code: str = "cls_code"  # the room this session is in
    secret: str = "cls_secret"  # the presenter's own session only: shown in its Presenter link
    # the presenter's browser, where it is the presenter by the store's trust alone (a restart forgot the secret)
    presenter_browser: str = "cls_presenter_browser"
    student: str = "cls_student"  # this session's student id
    address_read: str = "cls_address_read"  # the room link in the address was read (first run)
    messages: str = "cls_messages"  # control name -> message
    my_guess: str = "cls_my_guess"  # (context, the guessed token's text)
    seen_context: str = "cls_seen_context"  # the room's context this presenter's screen last showed
    invite_underway: str = "cls_invite_underway"  # whether the invite panel was last drawn folded (a token out)
    quiz_sent: str = "cls_quiz_sent"  # the quiz phase this student last sent answers in
    quiz_form: str = "cls_quiz_form"
    quiz_choice: str = "cls_quiz_choice_"  # prefix: one radio per question (and phase)
    quiz_send: str = "cls_quiz_send"
    quiz_before: str = "cls_quiz_before"  # the presenter's buttons
    quiz_after: str = "cls_quiz_after"
    quiz_close: str = "cls_quiz_close"
    download_csv: str = "cls_download_csv"
    download_json: str = "cls_download_json"
    # widgets
    start: str = "cls_start"
    join_form: str = "cls_join_form"
    join_code: str = "cls_join_code"
    name: str = "cls_name"
    join: str = "cls_join"
    leave: str = "cls_leave"
    peek_answer: str = "cls_peek_answer"  # the presenter looks at the hidden answer (off: what the projector shows)
    guess_text: str = "cls_guess_text_"  # + a slot: the guess field (class_room.guess_keys)
    guess_pick: str = "cls_guess_pick_"  # + a slot: the candidate chips
    guess_slots: str = "cls_guess_slots"  # context -> the slot its guess controls are drawn under
    qr: str = "cls_qr"  # the container of the QR code (its toolbar kept off the expander's header)
    invite: str = "cls_invite_"  # prefix: the invite panel, one key before the first token and one after
    # fragments
    follow: str = "cls_follow"
    follow_view: str = "cls_follow_view"  # the element inside `follow` that shows each new version and reruns it
    workspace: str = "cls_workspace"
    class_panel: str = "cls_class_panel"


@dataclass(frozen=True)
class DeterminismKeys(PageKeys):
    """Same prompt, different answers: the experiment's settings and its latest result."""

    prefix: ClassVar[str] = "det_"
    form: str = "det_form"
    prompt: str = "det_prompt"
    runs: str = "det_runs"
    tokens: str = "det_tokens"
    batch: str = "det_batch"
    temperature: str = "det_temperature"  # 0: greedy
    seed: str = "det_seed"
    run: str = "det_run"
    shown_run: str = "det_shown_run"  # which run in company the step-by-step section shows
    result: str = "det_result"  # (Experiment, DeterminismResult): the latest experiment this visitor ran
    error: str = "det_error"  # why the latest Run did not run (the visitor's settings are kept)
    step_chart: str = "det_step_chart"
    runs_chart: str = "det_runs_chart"


APP = AppKeys()
STEP = StepKeys()
LAB = LabKeys()
KV = KVKeys()
LESSON = LessonKeys()
CHAIN = ChainKeys()
CLASS = ClassKeys()
DETERMINISM = DeterminismKeys()
PAGES: tuple[PageKeys, ...] = (APP, STEP, LAB, KV, LESSON, CHAIN, CLASS, DETERMINISM)
