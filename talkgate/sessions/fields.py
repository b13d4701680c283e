"""Client input as every protocol reads it: JSON messages, typed fields, numbers, query parameters.

Each reader accepts what the docs say and nothing else, and refuses the rest with a SessionError
(code + readable message): JSON that is too large or nested too deep, NaN and Infinity, integers of
more than MAX_INT_DIGITS digits, strings that are not valid Unicode (a lone UTF-16 surrogate written
as a JSON escape), a bool where a number is expected, digits other than ASCII 0-9 in a query
parameter ("²".isdigit() is True in Python). Nothing here raises anything but SessionError.
"""
from __future__ import annotations

import json
import math
import re

MAX_INT_DIGITS = 20                 # a 64-bit seed (2^64 - 1) has 20
# a JSON escape of a UTF-16 surrogate: the only way a decoded message can hold a lone one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_ASCII_INT = re.compile(r"-?[0-9]{1,20}\Z")


class SessionError(Exception):
    """A client mistake answered with an error event; the session lives on. `status`: the HTTP status that answers
    it where its code's (sessions/actions.py http_status) is not the one."""

    status: int | None = None

    def __init__(self, code: str, message: str, context_id: str | None = None):
        super().__init__(message)
        self.code, self.message, self.context_id = code, message, context_id


def _constant(name: str):
    raise SessionError("invalid_json", f"{name} is not a JSON number")


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise SessionError("invalid_json", f"number {text[:20]}... is out of range")
    return v


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise SessionError("invalid_json", f"integer of {len(text)} digits: at most {MAX_INT_DIGITS}")
    return int(text)


def load_json(data: str | bytes, max_bytes: int) -> object:
    """A client's JSON text -> its value; raises SessionError (message_too_large, invalid_json)."""
    size = len(data) if isinstance(data, bytes) or len(data) * 4 <= max_bytes else len(data.encode())
    if size > max_bytes:
        raise SessionError("message_too_large", f"message over {max_bytes} bytes")
    try:
        value = json.loads(data, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise SessionError("invalid_json", "message is nested too deeply") from None
    except UnicodeDecodeError:
        raise SessionError("invalid_json", "message is not UTF-8") from None
    except ValueError as e:
        raise SessionError("invalid_json", f"message is not valid JSON: {e}") from None
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    if _SURROGATE_ESCAPE.search(text):
        _check_unicode(value)
    return value


def load_message(data: str | bytes, max_bytes: int) -> dict:
    """load_json of a message that must be a JSON object."""
    msg = load_json(data, max_bytes)
    if not isinstance(msg, dict):
        raise SessionError("invalid_message", "a message must be a JSON object")
    return msg


def _check_unicode(value: object) -> None:
    """Every string (keys too) encodes as UTF-8: no lone surrogate. Iterative: values nest deeply."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise SessionError("invalid_message", "a string holds a lone UTF-16 surrogate "
                                   "(not valid Unicode)") from None


def show(value: object) -> str:
    """A client's value, short and safe to put in a message (never a deep or huge repr)."""
    if isinstance(value, str):
        return repr(value[:40] + "..." if len(value) > 40 else value)
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value)
        return text if len(text) <= 40 else text[:40] + "..."
    return f"a JSON {'object' if isinstance(value, dict) else 'array' if isinstance(value, list) else 'value'}"


def field_of(msg: dict, name: str, kind, default=None, context_id: str | None = None, required: bool = False):
    """msg[name] checked against `kind` (a type or tuple; bool is not a number); absent or null ->
    `default`, or an error when `required`. Every protocol translator parses its fields with this."""
    v = msg.get(name)
    if v is None:
        if required:
            raise SessionError("invalid_message", f"missing required field {name!r}", context_id)
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        raise SessionError("invalid_message", f"field {name!r} has the wrong type", context_id)
    return v


def number(msg: dict, name: str, lo: float, hi: float, default=None, context_id: str | None = None,
           code: str = "invalid_params") -> float | None:
    """A JSON number (int or float, not bool) in [lo, hi], as a float; absent or null -> default."""
    v = field_of(msg, name, (int, float), None, context_id)
    if v is None:
        return default
    if not lo <= v <= hi:
        raise SessionError(code, f"{name} must be between {lo:g} and {hi:g}", context_id)
    return float(v)


def integer(msg: dict, name: str, lo: int, hi: int, default=None, context_id: str | None = None,
            code: str = "invalid_params") -> int | None:
    """A JSON integer (not bool, not 3.0) in [lo, hi]; absent or null -> default."""
    v = field_of(msg, name, int, None, context_id)
    if v is None:
        return default
    if not lo <= v <= hi:
        raise SessionError(code, f"{name} must be an integer from {lo} to {hi}", context_id)
    return v


def query_int(text: str, lo: int, hi: int) -> int | None:
    """A query parameter of ASCII digits (an optional minus) in [lo, hi], else None."""
    if not _ASCII_INT.match(text):
        return None
    v = int(text)
    return v if lo <= v <= hi else None
