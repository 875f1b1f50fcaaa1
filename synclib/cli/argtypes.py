"""Option types for the command line: each parses one value or refuses it with a message naming what was
expected, so that ``argparse`` stops before any work (``error: argument --name: ...``, exit status 2).

An option that sets a run-config key takes :func:`setting` (checked by :func:`synclib.keys.check_setting`);
:func:`arg_type` wraps the parsers of the few options that are no key.
"""
from __future__ import annotations

import argparse
import re

from synclib.keys import check_setting

__all__ = ["arg_type", "setting", "NULL", "value_of", "positive_int", "index_list"]


def arg_type(fn, what: str):
    """``fn`` as an argparse ``type``: its ValueError becomes ``"{what}: {message}"``."""
    def parse(text):
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{what}: {exc}") from None
    parse.__name__ = what
    return parse


def _value(text: str):
    """A command-line value as a config file would hold it: ``none``/``null`` -> None, ``true``/``false``, an
    integer, a number, a list of integers (``0-4,7``: :func:`index_list`) or of numbers (``0.1,1,10``), else text."""
    t = str(text).strip()
    if t.lower() in ("none", "null"):
        return None
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    for parse in (int, float):
        try:
            return parse(t)
        except ValueError:
            pass
    if re.fullmatch(r"[\d\s,-]+", t):
        return index_list(t)
    if "," in t:
        try:
            return [_number(x) for x in t.split(",")]
        except ValueError:
            pass
    return t


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        return float(text)


class _Null:
    """The key's null given on the command line (see :func:`setting`)."""

    def __repr__(self) -> str:
        return "NULL"


#: what :func:`setting` returns for the key's null, told apart from an option not given (argparse's None)
NULL = _Null()


def value_of(parsed):
    """A :func:`setting` option's value as the key holds it: :data:`NULL` -> None."""
    return None if parsed is NULL else parsed


def setting(path: str, zero: bool = False):
    """An argparse ``type`` for the option of config key ``path`` (``"simulate.temperature"``): its text read by
    :func:`_value` (one number, where the key takes only a list, as a list of it) and checked by the key's rule.
    The key's null (``none``, with ``zero`` also ``0``) comes back as :data:`NULL`. Empty text is the empty list
    where the key takes one (``--lags ''``), else the key's null."""
    name = path.rsplit(".", 1)[-1]

    def parse(text):
        if not str(text).strip():
            for empty in ([], None):
                try:
                    checked = check_setting(None, name, path, empty)
                    return NULL if checked is None else checked
                except ValueError:
                    pass
        try:
            value = _value(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if zero and value == 0 and type(value) is int:
            value = None
        try:
            checked = check_setting(None, name, path, value)
            return NULL if checked is None else checked
        except ValueError as exc:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                try:
                    return check_setting(None, name, path, [value])
                except ValueError:
                    pass  # the error names the value as given, not as a list
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = name
    return parse


def _int(text) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None


def positive_int(text) -> int:
    v = _int(text)
    if v < 1:
        raise ValueError(f"must be >= 1, got {v}")
    return v


def index_list(text: str) -> list[int]:
    """``"0-39,45"`` -> ``[0, 1, ..., 39, 45]`` (order kept, duplicates rejected)."""
    out: list[int] = []
    for piece in str(text).split(","):
        piece = piece.strip()
        if not piece:
            raise ValueError(f"empty item in {text!r}")
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", piece)
        if m:
            lo, hi = int(m[1]), int(m[2])
            if hi < lo:
                raise ValueError(f"range {piece!r} runs backwards")
            out.extend(range(lo, hi + 1))
        elif re.fullmatch(r"\d+", piece):
            out.append(int(piece))
        else:
            raise ValueError(f"{piece!r} is neither an index nor a range like 0-39")
    if len(set(out)) != len(out):
        raise ValueError(f"duplicate indices in {text!r}")
    return out
