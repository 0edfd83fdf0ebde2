"""Command line: generate step by step and print what happened at each step.

    python -m engine --prompt "The capital of France is" --temperature 0 --max-new-tokens 8
    python -m engine proofs   # which fast paths the probes proved on this machine, and why
    python -m engine check sampler student.py   # a student's final_distribution against the engine's
    python -m engine check stop student.py      # a student's find_stop against the engine's
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from engine.checker import STUDENT_FUNCTIONS, StudentCodeError, check_sampler, check_stop, load_student
from engine.errors import GenerationFinished, ModelLoadError, PromptError, SettingsError
from engine.fast import Proof, proof_decisions
from engine.forward import lone_pass_decision, verify_pass_decision
from engine.generation import Generation, StepRecord
from engine.inside import InsideView
from engine.loading import LoadedModel, load_model
from engine.settings import CHAINS, SamplerSettings, StopSettings
from engine.slide import SLIDE_SIZES
from engine.speculative.drafting import DraftMethod, DraftModel
from engine.speculative.generation import RoundRecord, SpeculativeGeneration
from engine.speculative.methods import DRAFT_METHODS, draft_for
from engine.speculative.trace import save_speculative_trace
from engine.stopping import unescape
from engine.trace import generation_recording, generation_slide, to_trace, write_json


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", required=True, help="text to continue (the user message with --chat)")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--model", default=None, help="Hub id, model folder or .gguf file (default: bundled)")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1)")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    parser.add_argument("--repetition-penalty", type=float, default=1.0, help="1 = off")
    parser.add_argument("--chain", default="transformers", choices=sorted(CHAINS), help="sampler stage order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draw", default="cdf", choices=["cdf", "multinomial"],
                        help="cdf: one uniform u per step; multinomial: as torch.multinomial / generate()")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--stop", action="append", default=[],
                        help="stop sequence (repeatable, up to 4); \\n is a newline, \\t a tab, \\\\ a backslash")
    parser.add_argument("--ignore-eos", action="store_true", help="keep going after the end token")
    parser.add_argument("--allow-special-tokens", action="store_true",
                        help="with --chat: typed special-token text becomes special tokens (prompt-injection demo)")
    parser.add_argument("--json", metavar="PATH", help="write the full trace as JSON")
    parser.add_argument("--html", metavar="PATH", help="write a recording: one web page that replays the generation "
                        "step by step with no server (it carries the trace; the app reads it back)")
    parser.add_argument("--slide", metavar="PATH", help="write the last step (or --slide-step) as a PNG for a slide: "
                        "the chips, the distribution with the pick and the sampler's decision")
    parser.add_argument("--slide-step", type=int, help="the step the slide shows (default: the last)")
    parser.add_argument("--slide-size", default="1920x1080", choices=sorted(SLIDE_SIZES), help="the slide's pixels")
    parser.add_argument("--slide-theme", default="light", choices=["light", "dark"])
    parser.add_argument("--inside", action="store_true",
                        help="look inside each step's forward pass: the logit lens, attention and time per layer "
                             "(in the trace, each step's \"inside\")")
    parser.add_argument("--speculative", choices=[*DRAFT_METHODS, "draft-model"],
                        help="speculative decoding: where the guesses come from (one row per round)")
    parser.add_argument("--draft-k", type=int, default=4,
                        help="the most tokens guessed per round, 1 to 8 (default 4; the trained drafts stop "
                        "sooner when unsure)")
    parser.add_argument("--draft-model", metavar="SOURCE",
                        help="with --speculative draft-model: a model with the same tokenizer (Hub id, folder, .gguf)")
    return parser.parse_args(argv)


def _show(text: str, width: int = 14) -> str:
    return repr(text)[1:-1][:width]  # newlines and tabs as \n, \t


def format_row(step: StepRecord) -> str:
    """One table row: step, token, probabilities, top-3, KV positions, stop status."""
    alternatives = ", ".join(f"{_show(c.text, 10)} {c.prob:.3f}" for c in step.distribution.top[:3])
    status = step.termination.finish_reason or ("partial stop" if any(s.partial for s in step.termination.stops)
                                                else "")
    marker = "*" if step.decision.forced else " "
    return (f"{step.index:>4} {marker}{_show(step.token.text):<15} {step.prob:>7.4f} {step.final_prob:>7.4f}  "
            f"{alternatives:<48} {step.kv.positions:>6}  {status}")


HEADER = f"{'step':>4}  {'token':<15} {'prob':>7} {'final':>7}  {'top-3 (raw prob)':<48} {'KV pos':>6}  stop"
ROUND_HEADER = (f"{'round':>5} {'guessed':>7} {'kept':>4}  {'tokens added':<40} {'KV':>13} {'verify ms':>9}  stop")


def format_round(record: RoundRecord) -> str:
    """One table row per round: guesses, kept, the tokens it added (| marks the target's own
    token), the KV cache before -> after (cropped), the verify pass's time, stop status."""
    kinds = {"accepted": "", "replaced": "|", "bonus": "|+", "plain": ""}
    added = "".join(kinds[kind] + _show(piece.text, 40) for piece, kind in zip(record.emitted, record.emitted_kinds,
                                                                               strict=True))
    kv = f"{record.kv.before}->{record.kv.after} -{record.kv.cropped}"
    return (f"{record.index:>5} {len(record.drafted):>7} {record.accepted:>4}  {added[:40]:<40} {kv:>13} "
            f"{record.timing.verify_ms:>9.1f}  {record.termination.finish_reason or ''}")


def make_draft(lm: LoadedModel, method: str, draft_source: str | None) -> DraftMethod:
    """The draft method the options ask for (raises SettingsError or ModelLoadError)."""
    if method != "draft-model":
        return draft_for(lm, method)
    if not draft_source:
        raise SettingsError("--draft-model", draft_source, "a model source with --speculative draft-model")
    return DraftModel(load_model(draft_source, device=lm.device), lm)


def run_speculative(args: argparse.Namespace, lm: LoadedModel, sampler: SamplerSettings, stop: StopSettings) -> int:
    try:
        generation = SpeculativeGeneration(lm, args.prompt, chat=args.chat, sampler=sampler, stop=stop,
                                           seed=args.seed, k=args.draft_k,
                                           draft=make_draft(lm, args.speculative, args.draft_model))
    except (SettingsError, PromptError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"model: {lm.name} on {lm.device}\nprompt: {len(generation.prompt_ids)} tokens · draft: "
          f"{generation.draft.label} · k = {generation.k}\n{ROUND_HEADER}")
    for record in generation.run():
        print(format_round(record), flush=True)
    tokens, passes = len(generation.generated_ids), len(generation.rounds)
    rate = generation.acceptance_rate
    print(f"finish_reason: {generation.finish_reason}\ntokens: {tokens} in {passes} forward passes "
          f"({tokens / passes:.2f} per pass); guesses kept: {'-' if rate is None else f'{rate:.2f}'}\n"
          f"text: {generation.text!r}")
    if args.json:
        print(f"trace: {save_speculative_trace(generation, args.json)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["proofs"]:
        return proofs_main(argv[1:])
    if argv[:1] == ["check"]:
        return check_main(argv[1:])
    args = parse_args(argv)
    try:
        sampler = SamplerSettings(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                  min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                                  chain=args.chain)
        stop = StopSettings(max_new_tokens=args.max_new_tokens, stop_sequences=tuple(unescape(s) for s in args.stop),
                            ignore_eos=args.ignore_eos)
        for option, path in (("--json", args.json), ("--html", args.html), ("--slide", args.slide)):
            if path:
                check_writable(Path(path), option)  # before the generation, not after it
        lm = load_model(args.model)
        if args.speculative:
            return run_speculative(args, lm, sampler, stop)
        generation = Generation(lm, args.prompt, chat=args.chat, sampler=sampler, stop=stop, seed=args.seed,
                                draw=args.draw, allow_special=args.allow_special_tokens)
        generation.inside = args.inside
    except (SettingsError, PromptError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"model: {lm.name} on {lm.device} ({str(lm.dtype).removeprefix('torch.')}), "
          f"loaded in {lm.load_seconds:.1f} s{' from cache' if lm.from_cache else ''}")
    print(f"prompt: {len(generation.prompt_ids)} tokens\n{HEADER}")
    inside: list[dict] = []  # each step's view, taken while its pass is kept
    try:
        for step in generation.run():
            print(format_row(step), flush=True)
            if args.inside:
                view = generation.inside_view()
                inside.append(view.to_dict())
                print(format_inside(view), flush=True)
    except GenerationFinished:  # pragma: no cover - run() stops before this
        pass
    print(f"finish_reason: {generation.finish_reason}\ntext: {generation.text!r}")
    trace = to_trace(generation)
    for step_dict, view in zip(trace["steps"], inside, strict=False):
        step_dict["inside"] = view
    for kind, path, write in (("trace", args.json, lambda target: write_json(trace, target)),
                              ("recording", args.html, lambda target: write_recording(generation, trace, target)),
                              ("slide", args.slide, lambda target: write_slide(generation, trace, args, target))):
        if not path:
            continue
        try:
            print(f"{kind}: {write(path)}")
        except OSError as exc:
            print(f"error: cannot write the {kind} to {path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        except SettingsError as exc:  # a --slide-step the generation does not have
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


def write_slide(generation: Generation, trace: dict, args: argparse.Namespace, path: str) -> Path:
    """The slide of a step as a PNG; a step this generation does not have is refused by name."""
    png = generation_slide(generation, args.slide_step, SLIDE_SIZES[args.slide_size], args.slide_theme, trace)
    target = Path(path)
    target.write_bytes(png)
    return target


def write_recording(generation: Generation, trace: dict, path: str) -> Path:
    """The recording's web page, with the trace as written (each step's look inside included)."""
    target = Path(path)
    target.write_text(generation_recording(generation, trace), encoding="utf-8")
    return target


def format_inside(view: InsideView) -> str:
    """Where the step's pick first leads, and the lens at a few layers."""
    shown = sorted({0, len(view.layers) // 2, len(view.layers) - 1} | ({view.first_lead} if view.first_lead else set()))
    lens = " · ".join(f"L{i} {_show(view.layers[i].top_text, 10)} {view.layers[i].top_prob:.2f}" for i in shown)
    lead = f"pick leads from layer {view.first_lead}" if view.first_lead is not None else "pick never leads"
    return f"      inside: {lead}; {lens}"


def check_writable(path: Path, option: str = "--json") -> None:
    """Refuse an output path whose folder does not exist or cannot be written."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise SettingsError(option, str(path), f"a file in an existing folder ({folder} does not exist)")
    if path.is_dir() or not os.access(folder, os.W_OK):
        raise SettingsError(option, str(path), "a file this user can write")


PROOF_COLUMNS = ("path", "model", "threads", "proven", "why")


def parse_proofs_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine proofs",
                                     description="Run the lone and packed passes' probes on this machine and print "
                                                 "each decision: which fast paths are proven, and why not.")
    parser.add_argument("--model", default=None, help="Hub id, model folder or .gguf file (default: bundled)")
    parser.add_argument("--threads", type=int, default=None, help="torch's thread count to probe at (default: as is)")
    return parser.parse_args(argv)


def proofs_main(argv: Sequence[str]) -> int:
    """`python -m engine proofs`: load the model, run every probe it can, print the decisions."""
    args = parse_proofs_args(argv)
    if args.threads is not None and args.threads < 1:
        print(f"error: {SettingsError('--threads', args.threads, 'a whole number from 1')}", file=sys.stderr)
        return 2
    try:
        lm = load_model(args.model)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"model: {lm.name} on {lm.device}; probing...", flush=True)
    run_probes(lm)
    print(format_proofs(proof_decisions()))
    return 0


def run_probes(lm: LoadedModel) -> None:
    """Every probe of a lone visitor's and a server's passes for `lm`, at this thread count: the
    lone decode step, the verify pass, the packed decode steps (exact and fast, and the kernel
    or batched products their rows take) and the packed prompts. Each decides once (engine/fast/
    proofs.py); a decision already made is not made again."""
    from engine.serving.packed import exact_rows_kernel_in_use, scripted_plan, scripted_prefill  # a server's

    lone_pass_decision(lm)
    verify_pass_decision(lm)
    for exact in (True, False):
        scripted_plan(lm, exact)
    exact_rows_kernel_in_use(lm)  # the rows of a packed pass: the kernel, batched products or a loop, per weight
    scripted_prefill(lm)


def format_proofs(proofs: Sequence[Proof]) -> str:
    """A table of decisions, one a row: path, model, threads, proven, why."""
    rows = [(p.path, p.model, p.threads_text, "yes" if p.proven else "no", p.why) for p in proofs]
    widths = [max(len(row[i]) for row in [PROOF_COLUMNS, *rows]) for i in range(len(PROOF_COLUMNS) - 1)]
    return "\n".join("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]])
                     for row in [PROOF_COLUMNS, *rows])


def parse_check_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine check",
                                     description="Check your own sampler or stop-sequence code against the engine's "
                                                 "on the real model. Exit 0: it agrees everywhere; 1: it differs "
                                                 "(the first difference is printed); 2: it cannot be run.")
    parser.add_argument("subject", choices=sorted(STUDENT_FUNCTIONS),
                        help="sampler: final_distribution(logits, temperature, top_k, top_p, min_p); "
                             "stop: find_stop(text, stop_sequences)")
    parser.add_argument("file", help="the Python file that defines the function")
    parser.add_argument("--function", default=None, help="the function's name, if not the usual one")
    parser.add_argument("--model", default=None, help="Hub id, model folder or .gguf file (default: bundled)")
    return parser.parse_args(argv)


def check_main(argv: Sequence[str]) -> int:
    """`python -m engine check sampler|stop FILE`: the student's file is loaded before the model,
    so a file that cannot run is refused at once."""
    args = parse_check_args(argv)
    check = check_sampler if args.subject == "sampler" else check_stop
    try:
        function = load_student(args.file, args.function or STUDENT_FUNCTIONS[args.subject])
        report = check(function, load_model(args.model))
    except (StudentCodeError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.text())
    return 0 if report.passed else 1
