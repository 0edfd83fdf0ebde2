"""Class: one room, one generation. The presenter steps it with the Step page's controls; every
student's screen follows within a second; the class guesses each next token before the reveal.

The page is layout only. Who may change the room is decided in ui/controllers/class_room.py from this
session's own state (the presenter showed the room's secret; a student only its code), the
rooms are classroom/'s, and a student's whole view of one room version is built once for every
student (ui/views/class_room.py). A follower's page shows a new version when the follow endpoint
answers its long poll with the view every student shares; the fragment then reruns for the
student's own controls (ui/widgets/follow.py: the poll, the view, and a trigger that reruns the
fragment alone), and every FOLLOW_EVERY_S on its timer, the safety net where the endpoint cannot be reached:
a check that finds nothing new sends the same view again, which the browser holds already as a
cached message. `bench.class_bench` measures both.
"""

from __future__ import annotations

import time

import streamlit as st
from streamlit.errors import StreamlitAPIException

from classroom import ClassHall, StoreError
from engine import CHAINS
from ui.controllers import class_room as control
from ui.controllers import step_through as stepper
from ui.server import browser_key, class_quiz, current_hall, store_problem, wrong_codes
from ui.session import CLASS, STEP, load_presets, message, preset_named, slider_range, widget_range
from ui.views import PANEL_CSS, chain_name, distribution_bars_html, plain, quoted
from ui.views import class_room as views
from ui.widgets import (
    BACKWARD,
    FORWARD,
    RUN,
    continue_run,
    ensure_app_frame,
    follow_view,
    page_style,
    panels,
    presenter_keys,
    presenting,
)

S = st.session_state
P = control.presenter_state(S)
FOLLOW_EVERY_S = 3.0  # the safety net's check; under hall.PRESENCE_S, which counts a student connected
CLASS_PANEL_EVERY_S = 1.0  # the presenter's count of students and guesses


def hall() -> ClassHall:
    return current_hall()  # one dictionary lookup after the first


# ---- callbacks -------------------------------------------------------------------------------


def presenter_does(action) -> None:
    """A presenter control's callback: the Step page's action on the room as this screen showed
    it (refused, with why, if another presenter tab moved it on), then publish."""
    control.as_presenter(S, hall(), action, S.get(CLASS.seen_context))


def on_branch_choice(key: str, picked: int) -> None:
    chosen = S.get(key)
    if chosen is None or chosen == picked:
        S[key] = picked
        return
    presenter_does(lambda state: stepper.branch(state, chosen))


def on_sampler_change() -> None:
    if P.get(STEP.generation) is None:
        return
    try:
        st.rerun(scope=CLASS.workspace)
    except StreamlitAPIException:
        return


def on_start() -> None:
    lm, scheduler = hall().lm, hall().scheduler
    control.start_class(S, hall(), lm, scheduler, browser_key())
    if control.role(S) == control.PRESENTER:
        st.query_params.from_dict({"room": S[CLASS.code]})


def on_join() -> None:
    control.join(S, hall(), S.get(CLASS.join_code, ""), S.get(CLASS.name, ""), browser_key(), wrong_codes())
    if control.role(S) == control.STUDENT:
        st.query_params.from_dict({"room": S[CLASS.code]})


def on_leave() -> None:
    control.leave(S)
    st.query_params.clear()


def on_guess_text(key: str, context: str) -> None:
    if text := (S.get(key) or "").strip():
        control.guess(S, hall(), text=text, context=context)


def on_guess_pick(key: str, context: str) -> None:
    if (token_id := S.get(key)) is not None:
        control.guess(S, hall(), token_id=token_id, context=context)


# ---- the lobby -------------------------------------------------------------------------------


def lobby() -> None:
    st.header("Class", anchor=False)
    st.caption("One room, one generation: the presenter steps the model, every student's screen follows, and the "
               "class guesses each next token before the reveal. No accounts: a join code, or a link.")
    teach, learn = st.columns(2, gap="large")
    with teach:
        st.markdown("#### Teach")
        st.markdown("Start a room and show its code and QR code on the projector. You drive; the class follows.")
        st.button("Start a class", key=CLASS.start, type="primary", on_click=on_start, icon=":material/school:")
        if problem := control.problem(S, "start"):
            st.error(plain(problem), icon=":material/back_hand:")
    with learn:
        st.markdown("#### Join")
        with st.form(CLASS.join_form, border=False):
            st.text_input("Room code", key=CLASS.join_code, max_chars=12, placeholder="e.g. K7QW3M")
            st.text_input("Your name (optional, shown to the presenter)", key=CLASS.name,
                          max_chars=hall().limits.max_name_chars)
            st.form_submit_button("Join", key=CLASS.join, on_click=on_join)
        if problem := control.problem(S, "join"):
            st.error(plain(problem), icon=":material/back_hand:")


# ---- the presenter ---------------------------------------------------------------------------


def invite(code: str) -> None:
    """The code, the QR code of the student link, and both links as text to copy."""
    base = (st.context.url or "").split("?")[0]
    student_link = f"{base}?room={code}"
    if warning := control.link_warning(base):
        st.warning(plain(warning), icon=":material/wifi_off:")
    # open until the first token, then folded: the reveal must fill the projector's screen (a new key
    # then, because the browser keeps an expander as it last drew it whatever `expanded` says)
    underway = bool(P.get(STEP.generation) and P[STEP.generation].steps)
    S[CLASS.invite_underway] = underway
    with st.expander(f"Invite the class · code {code}", expanded=not underway,
                     key=CLASS.invite + ("underway" if underway else "lobby")):
        qr_col, text_col = st.columns([1, 2], gap="medium")
        with qr_col, st.container(key=CLASS.qr):
            st.image(views.qr_svg(student_link), width=220, caption="The student link",
                     alt=f"QR code of the student link for room {code}")
        with text_col:
            panels.html(views.CLASS_CSS + f'<div>Join code</div><div class="tbt-class-code">{code}</div>')
            st.markdown("**Student link**")
            st.code(student_link, language=None, wrap_lines=True)
            with st.popover("Presenter link (keep it to yourself)", icon=":material/key:"):
                if control.presenter_link_known(S):
                    st.caption("It carries this room's secret: whoever opens it drives the room. It is shown only "
                               "here, on the presenter's screen. This browser stays the presenter when it reloads or "
                               "opens the room in another tab, after a server restart too; another browser or device "
                               "needs this link.")
                    st.code(f"{student_link}&key={S[CLASS.secret]}", language=None, wrap_lines=True)
                else:
                    st.caption("The server restarted since this browser opened the room as presenter: it is the "
                               "presenter still, but the server keeps only a fingerprint of the room's secret, so it "
                               "cannot show the presenter link again. Another device needs the link as it was shown "
                               "when the room was made.")


def setup_controls() -> None:
    prompt_col, preset_col, more_col = st.columns([5, 3, 2], gap="small")
    with prompt_col:
        st.text_area("Prompt", key=P.key(STEP.prompt), height=68, persist_state="session",
                     help="What the model continues, for the whole room. Changing it starts over.")
    with preset_col:
        presets = load_presets()
        st.selectbox("Presets", [p.name for p in presets], index=None, key=P.key(STEP.preset),
                     on_change=stepper.choose_preset, args=(P,), placeholder="Pick an example…",
                     persist_state="session")
        st.toggle("Chat template", key=P.key(STEP.chat), persist_state="session")
    with more_col:
        st.number_input("Seed", **widget_range(STEP.seed), key=P.key(STEP.seed), persist_state="session")
        with st.popover("Stop settings", icon=":material/stop_circle:", width="stretch"):
            st.number_input("Max new tokens", **widget_range(STEP.max_new_tokens), key=P.key(STEP.max_new_tokens),
                            persist_state="session")
            st.text_area("Stop sequences (one per line, up to 4; write a newline as \\n)",
                         key=P.key(STEP.stop_sequences), height=100, persist_state="session")
            st.toggle("Ignore EOS", key=P.key(STEP.ignore_eos), persist_state="session")
    if P.get(STEP.preset):
        st.caption(f"Preset: {preset_named(presets, P[STEP.preset]).about}")
    for name in ("prompt", "stop"):
        if problem := message(P, name):
            st.error(plain(problem), icon=":material/back_hand:")


def sampler_controls() -> None:
    st.markdown("#### Sampler")
    # the room's settings outlive a visit to another page (Streamlit drops an undrawn widget's value otherwise)
    moved = {"on_change": on_sampler_change, "persist_state": "session"}
    for key, label in ((STEP.temperature, "Temperature"), (STEP.top_k, "Top-k"), (STEP.top_p, "Top-p"),
                       (STEP.min_p, "Min-p"), (STEP.repetition_penalty, "Repetition penalty")):
        st.slider(label, **slider_range(key, P), key=P.key(key), **moved)
    st.selectbox("Chain order", list(CHAINS), key=P.key(STEP.chain), format_func=chain_name, **moved)


def button_row(gen) -> None:
    running, finished, unusable = stepper.is_running(P), gen.finished, stepper.prompt_problem(P)
    row = st.container(horizontal=True, vertical_alignment="center")
    row.button("Step", key=P.key(STEP.step), type="primary", on_click=presenter_does, args=(stepper.step_now,),
               disabled=running or finished or bool(unusable), help="Reveal the next token to the class.")
    row.button("Stop" if running else "Run", key=P.key(STEP.run), args=(stepper.stop_run if running else
                                                                         stepper.start_run,),
               on_click=presenter_does, disabled=(finished or bool(unusable)) and not running)
    row.button("Back", key=P.key(STEP.back), on_click=presenter_does, args=(stepper.back,),
               disabled=running or not gen.steps)
    row.button("Reset", key=P.key(STEP.reset), on_click=presenter_does, args=(stepper.reset,), disabled=running)
    count = len(gen.steps)
    row.markdown(f"**{count}** token{'s' if count != 1 else ''} generated · prompt {len(gen.prompt_ids)} tokens"
                 + (f" · :orange-background[finished: {gen.finish_reason.replace('_', ' ')}]" if gen.finished else "")
                 + (" · running…" if running else ""))
    if problem := message(P, "buttons"):
        st.warning(plain(problem), icon=":material/back_hand:")


@st.fragment(key=CLASS.class_panel, run_every=CLASS_PANEL_EVERY_S)
def class_panel() -> None:
    """Students connected, guesses in: the class's guesses beside the model's distribution
    (the students see neither until the reveal)."""
    room = control.current_room(S, hall())
    if room is None:
        return
    if S.get(CLASS.seen_context, room.snapshot.context) != room.snapshot.context:  # moved on by another tab
        st.rerun()
    peek = room.peek if room.peek is not None and room.peek.context == room.snapshot.context else None
    tally = hall().class_tally(room)
    with st.container(border=True):
        st.markdown(f"#### The class · {hall().connected(room)} connected · {tally.total} "
                    f"guess{'es' if tally.total != 1 else ''} for the next token")
        # this screen is the projector's: the answer and the names show only while the presenter holds the toggle
        if not st.toggle("Peek at the guesses and the model's answer (not for the projector)",
                         key=CLASS.peek_answer, persist_state="session"):
            panels.html(views.waiting_html(tally))
            return
        guesses_col, model_col = st.columns(2, gap="medium")
        with guesses_col:
            panels.html(views.class_guesses_html(tally) + views.guesses_table(tally, None))
        with model_col:
            if peek is not None:
                panels.html('<div class="tbt-title">The model\'s distribution for the next token (hidden from the '
                            "class)</div>" + distribution_bars_html(peek.distribution, None))


@st.fragment(key=CLASS.workspace)
def workspace() -> None:
    """Buttons, the context, the class panel and the sampler's view of the latest step. Drawn
    holding the room's lock (a peek steps the same generation); once drawn, the next token's
    peek starts."""
    room = control.current_room(S, hall())
    if room is None:
        st.rerun()
    with room.lock:
        draw_workspace(room)
    if stepper.is_running(P):
        continue_run(stepper.RUN, P)
    if not stepper.is_running(P):
        hall().peek_later(room)


def draw_workspace(room) -> None:
    gen = room.generation
    P[STEP.generation] = gen
    stepper.keep_open(P)
    if stepper.is_running(P):
        presenter_does(lambda state: stepper.advance_run(state, room.generation, time.monotonic()))
        gen = room.generation
    S[CLASS.seen_context] = room.snapshot.context  # what this screen shows from here on
    if S.get(CLASS.invite_underway, bool(gen.steps)) != bool(gen.steps):
        st.rerun()  # the first token (or a Reset): the whole page, so the invite panel folds (or opens)
    button_row(gen)
    if problem := control.problem(S, "refused"):
        st.error(plain(problem), icon=":material/block:")
    if room.snapshot.reveal is not None:  # right under the buttons: after a Step, the reveal is what the class sees
        panels.html(views.reveal_html(room.snapshot) + views.lesson_html(room.snapshot.lesson, room.snapshot.board))
    if presenting():
        panels.context_window_panel(gen, stepper.prompt_html(P, gen))
    else:
        panels.context_panel(gen, stepper.prompt_html(P, gen), legend=False)
    class_panel()
    view = stepper.sampler_view(P, gen)
    hall().publish(room, gen)  # the sampler as the controls set it is the room's too
    S[CLASS.seen_context] = room.snapshot.context
    if view.problem:
        st.error(plain(view.problem), icon=":material/back_hand:")
    if view.record is None:
        return
    if presenting():
        panels.distribution_bars_panel(view.record, view.decision, view.distribution)
    else:
        panels.distribution_panel(view.record, view.decision, view.distribution, mode_key=P.key(STEP.chart_mode),
                                  chart_key=P.key(STEP.distribution_chart))
        panels.decision_and_branch_panel(view.record, view.decision, view.distribution, gen.lm.texts,
                                         on_branch_choice, key_prefix=P.key(STEP.force_prefix))


def presenter_page() -> None:
    result = control.presenter_generation(S, hall(), hall().lm, hall().scheduler)
    if result is None:
        lobby()
        return
    room, _ = result
    presenter_keys({P.key(STEP.step): FORWARD, P.key(STEP.back): BACKWARD, P.key(STEP.run): RUN})
    if not presenting():
        st.header(f"Class · room {room.code}", anchor=False)
        st.caption("You are the presenter: Step reveals the next token on every student's screen. Before each Step "
                   "the class can guess; their guesses appear below beside the model's distribution.")
    invite(room.code)
    with st.expander("Prompt and settings") if presenting() else st.container():
        setup_controls()
    main_col, controls_col = st.columns([3, 1.1], gap="medium")
    with main_col:
        workspace()
    with controls_col:
        sampler_controls()
    quiz_controls(room)
    lesson_summary(room)


def quiz_controls(room) -> None:
    """The presenter opens the short quiz before the lesson and again after it."""
    questions, problem = class_quiz()
    open_phase = room.snapshot.quiz_open
    with st.expander(f"Quiz: open now ({open_phase} the lesson)" if open_phase else
                     "Quiz before and after the lesson", expanded=bool(open_phase)):
        if problem:
            st.warning(plain(problem), icon=":material/quiz:")
            return
        st.caption(f"{len(questions)} questions on autoregression, sampling, the KV cache and stopping (edit them in "
                   "assets/class_quiz.json). Open the quiz before the lesson and again after it: the summary below "
                   "sets the class's two results side by side.")
        row = st.container(horizontal=True)
        row.button("Open the quiz before the lesson", key=CLASS.quiz_before, disabled=open_phase == "before",
                   on_click=lambda: control.open_quiz(S, hall(), "before"))
        row.button("Open the quiz after the lesson", key=CLASS.quiz_after, disabled=open_phase == "after",
                   on_click=lambda: control.open_quiz(S, hall(), "after"))
        row.button("Close the quiz", key=CLASS.quiz_close, disabled=open_phase is None,
                   on_click=lambda: control.close_quiz(S, hall()))
        if open_phase:
            st.markdown(f"**{hall().quiz_answered(room)}** student(s) have answered so far.")
        if problem := control.problem(S, "quiz"):
            st.warning(plain(problem), icon=":material/back_hand:")


def lesson_summary(room) -> None:
    """The lesson so far, and the download only the presenter can take."""
    snapshot = room.snapshot
    with st.expander("End of the lesson: summary and download"):
        summary = control.summary(snapshot)
        panels.html(views.summary_html(summary, hall().quiz_phases(room)))
        download = control.lesson_download(S, hall())
        if download is None:
            return
        row = st.container(horizontal=True)  # each file is made when its button is clicked
        row.download_button("Download the lesson (CSV)", download.csv, file_name=f"{download.name}.csv",
                            mime="text/csv", key=CLASS.download_csv, on_click="ignore")
        row.download_button("Download the lesson (JSON)", download.json, file_name=f"{download.name}.json",
                            mime="application/json", key=CLASS.download_json, on_click="ignore")
        st.caption("Every revealed token and guess, with the names students chose, the scores and the quiz: for you "
                   "alone (students never see the names of others, and their links cannot fetch this).")


# ---- a student -------------------------------------------------------------------------------


def guess_controls(snapshot) -> None:
    """Guess the next token: type it, or pick a candidate chip. Changeable until the reveal."""
    pick_key, text_key = control.guess_keys(S, snapshot.context)
    # drawn (empty) before the candidates come too: the field below keeps its place in the page, so
    # their arrival, a moment after each reveal, never redraws a field a student is typing in
    chips = st.container()
    if snapshot.candidates:
        labels = {c.token_id: quoted(c.text) for c in snapshot.candidates}
        chips.pills("Pick a candidate", list(labels), format_func=labels.__getitem__, key=pick_key,
                    on_change=on_guess_pick, args=(pick_key, snapshot.context))
    st.text_input("Or type your guess for the next token (press Enter)", key=text_key,
                  max_chars=hall().limits.max_guess_chars, on_change=on_guess_text, args=(text_key, snapshot.context))
    if (mine := control.my_guess(S, snapshot)) is not None:
        st.markdown(f"Your guess: **{plain(quoted(mine))}** (you can change it until the reveal)")
    if problem := control.problem(S, "guess"):
        st.warning(plain(problem), icon=":material/back_hand:")


def quiz_form(phase: str) -> None:
    """The open quiz: one question each with its choices; answers can be sent again until the
    presenter closes it."""
    questions = hall().quiz
    keys = [f"{CLASS.quiz_choice}{phase}_{index}" for index in range(len(questions))]
    if any(key not in S for key in keys):  # the first draw: this student's answers as stored
        for index, choice in control.own_answers(S, hall()).items():
            S.setdefault(keys[index], choice)
    with st.form(CLASS.quiz_form):
        st.markdown(f"#### Quiz {phase} the lesson")
        for index, (question, key) in enumerate(zip(questions, keys, strict=True)):
            st.radio(f"{index + 1}. {question.text}", list(range(len(question.choices))), index=None, key=key,
                     format_func=question.choices.__getitem__)
        sent = st.form_submit_button("Send my answers", key=CLASS.quiz_send)
    if sent:
        control.answer_quiz(S, hall(), {index: S.get(key) for index, key in enumerate(keys)})
    if problem := control.problem(S, "quiz"):
        st.warning(plain(problem), icon=":material/back_hand:")
    elif S.get(CLASS.quiz_sent) == phase:
        st.caption("Answers sent. You can change them and send again until the presenter closes the quiz.")


@st.fragment(key=CLASS.follow, run_every=FOLLOW_EVERY_S)
def follow() -> None:
    """The room as the presenter last left it: redrawn when the room moves on, and every FOLLOW_EVERY_S."""
    snapshot = control.follow(S, hall())
    if snapshot is None:
        st.rerun()
    with st.container():  # always drawn, so a quiz opening does not move what follows it
        if snapshot.quiz_open:
            quiz_form(snapshot.quiz_open)
    above, below = views.follow_html(snapshot)
    follow_view(hall(), snapshot.code, snapshot.version, above)
    if not snapshot.finished:
        guess_controls(snapshot)
    if mine := views.own_score_html(control.own_score(S, snapshot)):
        panels.html(mine)
    if below:
        panels.html(below)


def student_page() -> None:
    code = S[CLASS.code]
    st.header(f"Class · room {code}", anchor=False)
    st.caption("This page follows the presenter's screen. Guess each next token before the presenter reveals it.")
    follow()
    named = bool((S.get(CLASS.name) or "").strip())
    with st.expander("Your name and the room" if named else "Your name (optional): tell the presenter who you are",
                     expanded=not named):
        st.text_input("Your name (optional, shown to the presenter)", key=CLASS.name,
                      max_chars=hall().limits.max_name_chars,
                      on_change=lambda: control.rename(S, hall(), S.get(CLASS.name, "")))
        if problem := control.problem(S, "name"):
            st.warning(plain(problem), icon=":material/back_hand:")
        else:
            st.caption(plain(f"The presenter sees you as {S[CLASS.name].strip()}." if named else
                             "No name yet: the presenter sees your guesses without one."))
        st.button("Leave the room", key=CLASS.leave, on_click=on_leave)


# ---- the page --------------------------------------------------------------------------------


def main() -> None:
    ensure_app_frame()
    st.html(PANEL_CSS)
    page_style()
    try:
        rooms = hall()
    except StoreError as exc:
        st.error(plain(f"Classes are not available on this server now: {store_problem(exc)} The other pages work "
                       "as usual."), icon=":material/error:")
        return
    params = {key: st.query_params.get(key) for key in ("room", "key") if key in st.query_params}
    control.open_address(S, rooms, params, browser_key(), wrong_codes())
    if "key" in st.query_params:  # the secret leaves the address bar at once (it is on the presenter's panel)
        del st.query_params["key"]
    if control.role(S) == control.PRESENTER:
        presenter_page()
    elif control.role(S) == control.STUDENT:
        student_page()
    else:
        lobby()


if __name__ == "__main__":
    main()
