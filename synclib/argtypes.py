"""Option types for the command line: each parses one value or refuses it with a message
naming what was expected, so that ``argparse`` stops before any work with
``synclib SUBCOMMAND: error: argument --name: ...`` and exit status 2.

An option that sets a run-config key takes :func:`setting`: the text read as a value and
checked by the schema's one check of that key (:func:`synclib.keys.check_setting`); the
sub-commands' defaults come from :func:`synclib.keys.default`.
"""
from __future__ import annotations

import argparse
import re

from synclib.keys import check_setting
from synclib.penalty import check_alpha_value

__all__ = ["arg_type", "setting", "NULL", "value_of", "positive_int", "nonneg_int", "nonneg_float", "positive_float",
           "index_list", "ridge_alpha"]


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
    """A command-line value as a config file would hold it: ``none``/``null`` -> None,
    ``true``/``false``, an integer, a number, a list of integers (``0-4,7``: :func:`index_list`),
    else the text."""
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
    return t


class _Null:
    """The key's null given on the command line (see :func:`setting`)."""

    def __repr__(self) -> str:
        return "NULL"


#: what :func:`setting` returns for the key's null, told apart from an option not given
#: (argparse's None); :func:`value_of` turns it back into None
NULL = _Null()


def value_of(parsed):
    """A :func:`setting` option's value as the key holds it: :data:`NULL` -> None."""
    return None if parsed is NULL else parsed


def setting(path: str, zero: bool = False):
    """An argparse ``type`` for the option of the config key ``path`` (e.g.
    ``"simulate.temperature"``): its text read as a value (:func:`_value`; one integer, where
    the key takes only a list, as a list of it) and checked by the key's one check.  The
    key's null (``none``, or with ``zero`` also ``0``: "all", "full batch") comes back as
    :data:`NULL`.  Empty text is "none of them": the empty list where the key takes one
    (``--lags ''``), else the key's null (``--sample-sizes ''``)."""
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
            if isinstance(value, int) and not isinstance(value, bool):
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


def _float(text) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if v != v:
        raise ValueError("NaN is not allowed")
    return v


def positive_int(text) -> int:
    v = _int(text)
    if v < 1:
        raise ValueError(f"must be >= 1, got {v}")
    return v


def nonneg_int(text) -> int:
    v = _int(text)
    if v < 0:
        raise ValueError(f"must be >= 0, got {v}")
    return v


def nonneg_float(text) -> float:
    v = _float(text)
    if v < 0:
        raise ValueError(f"must be >= 0, got {text}")
    return v


def positive_float(text) -> float:
    v = _float(text)
    if v <= 0:
        raise ValueError(f"must be > 0, got {text}")
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


def ridge_alpha(text):
    """A ridge penalty > 0, or ``"cv"`` (checked by :func:`synclib.penalty.check_alpha_value`);
    returns the config's form, ``"cv"`` or a float."""
    return check_alpha_value(text if text == "cv" else _float(text))
