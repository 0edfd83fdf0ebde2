"""Students' find_stop: the right one and wrong ones, each with one known mistake."""


def find_stop(text, stop_sequences):
    """Where the first stop sequence begins (the earliest in the text), or None."""
    found = [text.find(s) for s in stop_sequences if s in text]
    return min(found) if found else None


def returns_the_end(text, stop_sequences):
    found = [text.find(s) + len(s) for s in stop_sequences if s in text]
    return min(found) if found else None


def first_listed(text, stop_sequences):
    for s in stop_sequences:
        if s in text:
            return text.find(s)
    return None


_seen = {"text": ""}


def newest_token_only(text, stop_sequences):
    """Searches only what was appended since the previous call, as if each token were alone."""
    previous = _seen["text"] if text.startswith(_seen["text"]) else ""
    _seen["text"] = text
    newest = text[len(previous):]
    found = [len(previous) + newest.find(s) for s in stop_sequences if s in newest]
    return min(found) if found else None
