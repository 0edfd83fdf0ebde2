"""What one visitor's requests may cost a shared server: the caps checked before any work.

The defaults keep a local, single-user app as it always was (only the model's own context
window and the settings' own ranges); a public deployment (engine/serving/deployment.py) sets lower
caps. Every check raises the engine's own errors, naming the value and the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SettingsError, TraceError
from engine.settings import MAX_NEW_TOKENS, is_whole


@dataclass(frozen=True)
class Limits:
    """Caps on one visitor's work. None means no cap beyond the model's own."""

    max_prompt_tokens: int | None = None  # below the context window
    max_new_tokens: int = MAX_NEW_TOKENS
    max_replay_steps: int = 4096  # steps a trace or a share link may replay
    replay_seconds: float | None = None  # server time one replay may take
    max_upload_bytes: int = 20 * 2**20  # a trace file
    max_link_chars: int = 64_000  # a share link's query string

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "max_replay_steps", "max_upload_bytes", "max_link_chars"):
            value = getattr(self, name)
            if not is_whole(value) or value < 1:
                raise SettingsError(name, value, "a whole number >= 1")
        if self.max_prompt_tokens is not None and not (is_whole(self.max_prompt_tokens)
                                                       and self.max_prompt_tokens >= 1):
            raise SettingsError("max_prompt_tokens", self.max_prompt_tokens, "a whole number >= 1, or None")
        if self.replay_seconds is not None and not (isinstance(self.replay_seconds, (int, float))
                                                    and self.replay_seconds > 0):
            raise SettingsError("replay_seconds", self.replay_seconds, "a number of seconds > 0, or None")

    def check_new_tokens(self, max_new_tokens: int) -> None:
        if max_new_tokens > self.max_new_tokens:
            raise SettingsError("max_new_tokens", max_new_tokens,
                                f"at most {self.max_new_tokens:,} on this server")

    def check_replay_steps(self, steps: int) -> None:
        if steps > self.max_replay_steps:
            raise TraceError(f"It has {steps:,} steps; this server replays at most {self.max_replay_steps:,}.")

    def check_upload(self, size: int) -> None:
        if size > self.max_upload_bytes:
            raise TraceError(f"The file is {size / 2**20:.1f} MB; this server takes files up to "
                             f"{self.max_upload_bytes / 2**20:.1f} MB.")
