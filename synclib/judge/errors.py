"""The judge's exceptions."""
from __future__ import annotations

__all__ = ["JudgeError", "JudgeRequestError"]


class JudgeError(Exception):
    """Bad judge input or configuration; the message names the file, option or field."""


class JudgeRequestError(JudgeError):
    """A request to the judge failed for good (after the allowed retries)."""
