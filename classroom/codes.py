"""Room codes a student types, and the presenter's secret that only the presenter link carries.

A code is short and random (no sequence: `secrets.choice`), from an alphabet without the
letters and digits people confuse (0/O, 1/I/L). The secret has 192 bits from `secrets`; the
store keeps only its SHA-256 digest, and a secret offered is compared with that digest in
constant time (`hmac.compare_digest`), so neither a timing nor a copy of the database gives it away.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # 31 symbols: no 0, O, 1, I, L
CODE_LENGTH = 6  # 31**6 ≈ 887 million codes
SECRET_BYTES = 24  # 192 bits (at least 128 are asked for)
TRIES = 64  # fresh codes drawn before giving up (with a few open rooms, the first one is free)


def new_code(taken: Callable[[str], bool]) -> str:
    """A random room code that `taken` says is free."""
    for _ in range(TRIES):
        code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
        if not taken(code):
            return code
    raise RuntimeError(f"no free room code in {TRIES} draws")


def normalise_code(text: str) -> str | None:
    """A code as a student may type it (lower case, spaces or a dash inside) in its stored form;
    None when it cannot be a code at all."""
    code = "".join(ch for ch in text.upper() if ch not in " -")
    if len(code) != CODE_LENGTH or any(ch not in CODE_ALPHABET for ch in code):
        return None
    return code


def new_secret() -> str:
    """The presenter's secret, URL-safe."""
    return secrets.token_urlsafe(SECRET_BYTES)


def secret_digest(secret: str) -> str:
    """What the store keeps of a secret."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def secret_matches(digest: str, offered: str) -> bool:
    """Whether `offered` is the secret whose digest is `digest`, in constant time."""
    return hmac.compare_digest(digest.encode(), secret_digest(offered).encode())
