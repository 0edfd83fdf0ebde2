"""Errors the engine raises for bad input, each naming what is wrong and what is allowed."""

from __future__ import annotations


class SettingsError(ValueError):
    """A setting is outside its allowed range.

    Args:
        parameter: the setting's name as the user sees it (e.g. ``top_p``).
        value: the rejected value.
        allowed: the allowed range or values, in words (e.g. ``0 < top_p <= 1``).
    """

    def __init__(self, parameter: str, value: object, allowed: str) -> None:
        self.parameter = parameter
        self.value = value
        self.allowed = allowed
        super().__init__(f"{parameter} = {shown(value)} is not allowed: {allowed}.")


def shown(value: object, limit: int = 60) -> str:
    """A value as a message shows it: its repr, cut short (a hostile input can be megabytes, or
    an integer too long for repr to print)."""
    try:
        text = repr(value)
    except ValueError:  # int repr refuses more than 4,300 digits
        text = f"<a {type(value).__name__} too large to print>"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


class PromptError(ValueError):
    """The prompt cannot be used (empty, or longer than the context window)."""


class ModelLoadError(RuntimeError):
    """A model source could not be loaded; the message names the source and why."""


class GenerationFinished(RuntimeError):
    """A step was asked for after a termination condition fired."""

    @classmethod
    def closed(cls) -> GenerationFinished:
        """For a generation closed to free its memory (Generation.close, an idle tab)."""
        return cls("This generation was closed to free its memory: press Reset to start again.")


class TraceError(ValueError):
    """A trace file is malformed or of an unknown version."""
