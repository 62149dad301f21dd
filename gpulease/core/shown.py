"""How an error message shows a value someone sent: as they wrote it, never a Python repr.

A JSON body or a YAML file holds null, true, numbers, strings, lists and
mappings; a message about a wrong value names it in those words ("got the
number 5", "got null (no value)", "got a list"), not as Python prints it
("got None", "got [5]", "got {'a': 1}").
"""

from __future__ import annotations

import decimal
import json

MAX_TEXT = 60


def shown(value: object) -> str:
    """A value for an error message: 'text' quoted, numbers and null/true/false as in JSON."""
    if value is None:
        return "null (no value)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return f"the number {value}"
    if isinstance(value, str):
        text = value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + "…"
        # json.dumps escapes control characters; the quotes are plain single ones
        return "'" + json.dumps(text, ensure_ascii=False)[1:-1].replace('\\"', '"') + "'"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return "a mapping"
    return "a value of another kind"


def kind_of(value: object) -> str:
    """The kind of a value in JSON/YAML words: 'a string', 'a number', 'a list', ..."""
    if value is None:
        return "null (no value)"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float | decimal.Decimal):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "a value of another kind"
