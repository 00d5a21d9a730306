"""The outcome vocabulary every executor, the store and the selector share.

A verdict is stored as its string value; ``Verdict(text)`` reads it back and refuses an
unknown one.
"""

from __future__ import annotations

import enum


class Verdict(enum.StrEnum):
    OK = "ok"
    INCORRECT = "incorrect"  # ran, wrong result: can never be selected
    OOM = "oom"
    LAUNCH = "launch"  # a kernel or runtime error
    TIMEOUT = "timeout"  # a hang past the timeout
    UNAVAILABLE = "unavailable"  # the transport or kernel does not exist on this machine
    ERROR = "error"  # anything else
    #: timed faster than the physical floor (``ficco.measure.floor``) by more than the noise:
    #: the timing cannot be true (the timed run skipped work, or the clock lied); never a profile
    IMPLAUSIBLE = "implausible"

    @property
    def failed(self) -> bool:
        """Did not produce a verified result (incorrect included)."""
        return self is not Verdict.OK


class Unavailable(RuntimeError):
    """The schedule cannot run on this backend or machine (recorded as ``unavailable``)."""


def classify_failure(err: BaseException) -> Verdict:
    """The failure kind of an exception a schedule raised."""
    if isinstance(err, Unavailable):
        return Verdict.UNAVAILABLE
    text = f"{type(err).__name__}: {err}".lower()
    if "out of memory" in text:
        return Verdict.OOM
    if "timed out" in text or "timeout" in text:
        return Verdict.TIMEOUT
    if "unavailable" in text or "not supported" in text:
        return Verdict.UNAVAILABLE
    if "cuda" in text or "triton" in text or "launch" in text:
        return Verdict.LAUNCH
    return Verdict.ERROR
