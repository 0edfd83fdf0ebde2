"""One step of a generation as a picture for a slide (PNG, 1920x1080 or 1280x720).

The slide shows what a class looks at on the Step page: the context as chips (the newest ringed),
the next-token distribution (raw softmax and the final sampling distribution, the pick's row
marked) and the sampler's decision with the stop check, in the light or the dark theme. It is
drawn from a trace (`engine/trace.py`): every number is the trace's own. Drawn with Pillow, so
the command line needs no browser.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from engine.errors import SettingsError
from engine.tokens import visible

SLIDE_SIZES: dict[str, tuple[int, int]] = {"1920x1080": (1920, 1080), "1280x720": (1280, 720)}
ROWS = 8  # candidates drawn, then the pick if it is further down, then all the others


@dataclass(frozen=True)
class Palette:
    page: str
    ink: str
    muted: str
    chip: str
    rule: str
    raw: str
    final: str
    pick: str  # the pick's row: dark text on it in either theme
    newest: str


PALETTES = {
    "light": Palette("#ffffff", "#212529", "#5f5b57", "#f1f2f4", "#c9ced6", "#1c7ed6", "#e8590c", "#fff3bf", "#f08c00"),
    "dark": Palette("#171614", "#f1efe9", "#b8b3a8", "#2d2b27", "#5c5852", "#74c0fc", "#ffa94d", "#fff3bf", "#f08c00"),
}
# fonts with the glyphs the chips use (␣ ↵ ▶); Pillow's own font where none is installed
FONT_FILES = {
    "sans": ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "DejaVuSans.ttf"),
    "bold": ("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf", "DejaVuSans-Bold.ttf"),
    "mono": ("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf", "DejaVuSansMono.ttf"),
}


@cache
def font(kind: str, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    for name in FONT_FILES[kind]:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    return ImageFont.load_default(size)


def percent(p: float) -> str:
    if p >= 0.001 or p == 0:
        return f"{100 * p:.1f}%"
    return f"{100 * p:.3f}%" if p >= 1e-5 else f"{p:.1e}"


def parse_size(text: str) -> tuple[int, int]:
    """'1920x1080' or '1280x720'. Raises SettingsError naming the choices."""
    if text not in SLIDE_SIZES:
        raise SettingsError("slide size", text, " or ".join(SLIDE_SIZES))
    return SLIDE_SIZES[text]


def step_slide(trace: dict[str, Any], prompt_pieces: list[dict[str, Any]], step: int | None = None,
               size: tuple[int, int] = (1920, 1080), theme: str = "light") -> bytes:
    """Step `step` (1-based; the last when None) of the trace as a PNG of `size` in `theme`."""
    steps = trace.get("steps") or []
    index = len(steps) if step is None else step
    if not 1 <= index <= len(steps):
        raise SettingsError("step", step, f"a step of this generation, 1 to {len(steps)}" if steps else
                            "a step of a generation that has one (take a step first)")
    if size not in SLIDE_SIZES.values():
        raise SettingsError("slide size", f"{size[0]}x{size[1]}", " or ".join(SLIDE_SIZES))
    if theme not in PALETTES:
        raise SettingsError("theme", theme, " or ".join(PALETTES))
    picture = _Slide(size, PALETTES[theme])
    picture.draw(trace, prompt_pieces, index)
    out = io.BytesIO()
    picture.image.save(out, format="PNG", optimize=True)
    return out.getvalue()


class _Slide:
    def __init__(self, size: tuple[int, int], palette: Palette) -> None:
        self.width, self.height = size
        self.scale = self.width / 1920
        self.colours = palette
        self.image = Image.new("RGB", size, palette.page)
        self.pen = ImageDraw.Draw(self.image)

    def px(self, value: float) -> int:
        return round(value * self.scale)

    def text(self, at: tuple[float, float], words: str, kind: str = "sans", size: int = 30, colour: str | None = None,
             anchor: str = "la") -> float:
        """Write `words`; returns the x where they end."""
        face = font(kind, self.px(size))
        self.pen.text(at, words, font=face, fill=colour or self.colours.ink, anchor=anchor)
        return at[0] + self.pen.textlength(words, font=face)

    def draw(self, trace: dict[str, Any], pieces: list[dict[str, Any]], index: int) -> None:
        step, margin = trace["steps"][index - 1], self.px(60)
        self.text((margin, self.px(40)), f"Step {index}: the model wrote {visible(step['text'])!r} "
                  f"(raw p {percent(step['prob'])})", "bold", 46)
        chips_bottom = self.chips(pieces, trace["steps"][:index], margin, self.px(120), self.px(300))
        top = chips_bottom + self.px(40)
        self.distribution(step, margin, top, self.px(1100))
        self.decision(step, self.px(1220), top, self.width - margin)
        s, stop = trace.get("sampler") or {}, trace.get("stop") or {}
        model = (trace.get("model") or {}).get("name", "a model")
        self.text((margin, self.height - self.px(50)),
                  f"{model} · seed {trace.get('seed')} · temperature {s.get('temperature')}, top-k {s.get('top_k')}, "
                  f"top-p {s.get('top_p')}, min-p {s.get('min_p')} · at most {stop.get('max_new_tokens')} new tokens "
                  "· recorded with Token by Token", size=22, colour=self.colours.muted)

    def chips(self, pieces: list[dict[str, Any]], steps: list[dict[str, Any]], left: int, top: int, height: int
              ) -> int:
        """The context as chips, wrapped, its newest lines shown when it is taller than `height`."""
        face, pad, gap, line = font("mono", self.px(30)), self.px(8), self.px(6), self.px(48)
        tokens = [(p["text"], "prompt") for p in pieces] + [(s["text"], "gen") for s in steps]
        placed, x, y, right = [], left, 0, self.width - left
        for number, (text, kind) in enumerate(tokens):
            label = visible(text)
            width = self.pen.textlength(label, font=face) + 2 * pad
            if x + width > right and x > left:
                x, y = left, y + line
            placed.append((x, y, width, label, kind, number == len(tokens) - 1 and kind == "gen"))
            x += width + gap
            if text.endswith("\n"):
                x, y = left, y + line
        shift = max(0, y + line - height)  # the newest lines stay in view
        for x, y, width, label, kind, newest in placed:
            if y - shift < 0:
                continue
            box = (x, top + y - shift, x + width, top + y - shift + line - gap)
            fill = self.colours.chip if kind == "prompt" else self.colours.page
            outline = self.colours.newest if newest else (self.colours.rule if kind == "prompt" else self.colours.raw)
            self.pen.rounded_rectangle(box, radius=self.px(6), fill=fill, outline=outline,
                                       width=self.px(4) if newest else max(1, self.px(2)))
            self.pen.text((x + pad, box[1] + (line - gap) / 2), label, font=face, fill=self.colours.ink, anchor="lm")
        return top + min(height, y + line)

    def distribution(self, step: dict[str, Any], left: int, top: int, right: int) -> None:
        c = self.colours
        self.text((left, top), "The next-token distribution", "bold", 34)
        key_y = top + self.px(50)
        self.pen.rectangle((left, key_y + self.px(6), left + self.px(30), key_y + self.px(24)), fill=c.raw)
        end = self.text((left + self.px(40), key_y), "raw softmax (the model)", size=24, colour=c.muted)
        key_box = (end + self.px(30), key_y + self.px(6), end + self.px(60), key_y + self.px(24))
        self.pen.rectangle(key_box, fill=c.final)
        self.text((end + self.px(70), key_y), "final (after the sampler, drawn from)", size=24, colour=c.muted)
        rows = list(step["top"][:ROWS])
        if not any(row["token_id"] == step["token_id"] for row in rows):
            rows.append({"token_id": step["token_id"], "text": step["text"], "prob": step["prob"],
                         "final_prob": step["final_prob"], "rank": step["rank"]})
        others = step.get("others") or {}
        rows.append({"token_id": None, "text": None, "prob": others.get("prob", 0.0),
                     "final_prob": others.get("final_prob", 0.0), "rank": None, "count": others.get("count", 0)})
        label_right, bar_left, row_h = left + self.px(330), left + self.px(345), self.px(58)
        longest = max(max(row["prob"], row["final_prob"]) for row in rows) or 1.0
        span = (right - bar_left - self.px(120)) / longest
        y = key_y + self.px(48)
        for row in rows:
            pick = row["token_id"] == step["token_id"]
            if pick:
                self.pen.rectangle((left, y - self.px(4), right, y + row_h - self.px(6)), fill=c.pick)
            ink = "#212529" if pick else c.ink
            label = (("▶ " if pick else "") + f"#{row['rank']} {visible(row['text'])!r}" if row["token_id"] is not None
                     else f"all other {row['count']:,}")
            self.text((label_right, y + row_h / 2 - self.px(4)), label, "mono", 26, ink, "rm")
            for offset, (value, colour) in enumerate(((row["prob"], c.raw), (row["final_prob"], c.final))):
                bar_y = y + offset * self.px(24)
                self.pen.rectangle((bar_left, bar_y, bar_left + max(self.px(2), span * value), bar_y + self.px(18)),
                                   fill=colour)
                self.text((bar_left + span * value + self.px(10), bar_y - self.px(4)), percent(value) if
                          value or offset == 0 else "cut", size=20, colour=ink)
            y += row_h

    def decision(self, step: dict[str, Any], left: int, top: int, right: int) -> None:
        c = self.colours
        self.text((left, top), "The sampler's decision", "bold", 34)
        lines = [f"{stage['label']}: kept {stage['kept']:,}" + (f", cut {stage['removed']:,}" if stage["removed"]
                                                                 else "")
                 for stage in step.get("stages", []) if stage.get("active")] or ["no stage changes the distribution"]
        draw = step.get("draw")
        if step.get("forced"):
            lines.append("forced: chosen by hand, not drawn")
        elif step.get("greedy"):
            lines.append("greedy: the most probable token, no draw")
        elif draw:
            lines.append(f"draw: u = {draw['u']:.4f} in [{draw['cdf_low']:.4f}, {draw['cdf_high']:.4f})")
        lines.append(f"→ {visible(step['text'])!r}, final p {percent(step['final_prob'])}")
        y = top + self.px(56)
        for line in lines:
            y = self._wrapped(left, y, right, line, 26, c.ink)
        termination = step.get("termination") or {}
        reason = termination.get("finish_reason")
        y += self.px(24)
        self.text((left, y), "Check: stop or go on?", "bold", 34)
        y += self.px(56)
        check = (f"stop: {reason.replace('_', ' ')}" if reason else "no stop yet: go on") + (
            f" · {termination.get('new_tokens')} of {termination.get('max_new_tokens')} new tokens")
        self._wrapped(left, y, right, check, 26, c.ink)

    def _wrapped(self, left: int, y: int, right: int, words: str, size: int, colour: str) -> int:
        face, line = font("sans", self.px(size)), self.px(size * 1.45)
        current = ""
        for word in words.split(" "):
            trial = f"{current} {word}".strip()
            if self.pen.textlength(trial, font=face) > right - left and current:
                self.pen.text((left, y), current, font=face, fill=colour)
                y, current = y + line, word
            else:
                current = trial
        self.pen.text((left, y), current, font=face, fill=colour)
        return y + line


def save_slide(png: bytes, path: str | Path) -> Path:
    target = Path(path)
    target.write_bytes(png)
    return target
