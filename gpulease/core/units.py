"""Units gpulease reads from files and requests: durations, byte quantities, credits.

Every parser is strict and exact. Money never passes through float: prices are
parsed from their decimal text into integer micro-credits (µcr), and the YAML
and JSON loaders here turn non-integer numbers into `Decimal` built from the
number's own text, so "1.20" and an unquoted 1.20 mean the same exact amount.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import yaml

from gpulease.core.shown import shown

UCR_PER_CREDIT = 1_000_000
CREDIT_DECIMALS = 6
# Amounts are stored in signed 64-bit integer columns.
MAX_UCR = 2**63 - 1
# Durations are stored in 32-bit integer columns on some databases.
MAX_DURATION_S = 2**31 - 1

DURATION_HINT = "durations look like 90s, 30m, 2h, 1h30m or 0"
_DURATION = re.compile(r"(?:(\d{1,10})h)?(?:(\d{1,10})m)?(?:(\d{1,10})s)?")


def _prefix(field: str) -> str:
    return f"{field}: " if field else ""


def parse_duration(value: object, field: str = "") -> int:
    """Seconds from "90s", "30m", "2h", "1h30m", "1h30m15s", "0" or the integer 0."""
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return 0
    if isinstance(value, str) and value == "0":
        return 0
    match = _DURATION.fullmatch(value) if isinstance(value, str) and value else None
    if match is None:
        # A bare number is refused on purpose: is 30 seconds, minutes or hours?
        raise ValueError(f"{_prefix(field)}{shown(value)} is not a duration; {DURATION_HINT}")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total > MAX_DURATION_S:
        raise ValueError(f"{_prefix(field)}{shown(value)} is too long (at most {MAX_DURATION_S}s)")
    return total


def format_duration(seconds: int) -> str:
    """Canonical text of a duration: 5400 -> "1h30m", 90 -> "1m30s", 0 -> "0"."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
        raise ValueError(f"a duration is a non-negative integer of seconds, got {shown(seconds)}")
    if seconds == 0:
        return "0"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)


_QUANTITY_SUFFIXES: dict[str, int] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "": 1,
}
QUANTITY_HINT = "quantities look like 32Gi, 512Mi, 8G or a number of bytes"
_QUANTITY = re.compile(r"(\d{1,20}(?:\.\d{1,20})?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")


def parse_quantity(value: object) -> int:
    """Bytes from a Kubernetes quantity: binary Ki..Ei, decimal k..E, or plain bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{shown(value)} is negative; {QUANTITY_HINT}")
        return value
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        return parse_quantity(int(value))
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"{shown(value)} is not a quantity; {QUANTITY_HINT}")
    whole, _, frac = match.group(1).partition(".")
    factor = _QUANTITY_SUFFIXES[match.group(2) or ""]
    # Integer arithmetic: Decimal would round beyond its 28-digit context.
    scaled, rest = divmod(int(whole + frac) * factor, 10 ** len(frac))
    if rest:
        raise ValueError(f"{shown(value)} is not a whole number of bytes; {QUANTITY_HINT}")
    return scaled


def format_quantity(n: int) -> str:
    """Shortest exact quantity text for `n` bytes, preferring binary units: 34359738368 -> 32Gi."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"a quantity is a non-negative integer of bytes, got {shown(n)}")
    best = str(n)
    for suffix, factor in _QUANTITY_SUFFIXES.items():
        if suffix and n and n % factor == 0:
            text = f"{n // factor}{suffix}"
            if len(text) < len(best):
                best = text
    return best


_CPU = re.compile(r"(\d{1,6}(?:\.\d{1,3})?)|(\d{1,9})m")


def parse_cpu(value: object) -> Decimal:
    """Cores from 4, 0.5, "1.5" or "500m"; more than 0, at most 3 decimals (1m)."""
    text = value if isinstance(value, str) else None
    if isinstance(value, int | Decimal) and not isinstance(value, bool):
        text = str(value)
    match = _CPU.fullmatch(text) if text is not None else None
    if match is None:
        raise ValueError(f"{shown(value)} is not a CPU amount; cores look like 4, 0.5 or 500m")
    cores = Decimal(match.group(1)) if match.group(1) else Decimal(match.group(2)).scaleb(-3)
    if cores <= 0:
        raise ValueError(f"{shown(value)} is not more than 0 cores")
    return cores


CREDITS_HINT = "credits look like 12, 12.5 or 0.000001 (at most 6 decimals)"
_CREDITS = re.compile(r"[+-]?\d{1,30}(?:\.\d{1,40})?")
_MAX_CREDITS = Decimal(MAX_UCR).scaleb(-CREDIT_DECIMALS)


def parse_credits(value: object) -> int:
    """Micro-credits from a decimal amount of credits given as str, int or Decimal.

    A float is refused: it means the caller already went through binary
    floating point, where 0.1 is not 0.1, so the amount may not be what was written.
    """
    if isinstance(value, bool):
        raise ValueError(f"{shown(value)} is not an amount of credits; {CREDITS_HINT}")
    if isinstance(value, float):
        raise ValueError(
            f"{shown(value)} was read as a binary float, which cannot hold decimal amounts "
            "exactly; pass credits as a string or Decimal"
        )
    if isinstance(value, int):
        amount = Decimal(value)
    elif isinstance(value, str):
        if not _CREDITS.fullmatch(value):
            raise ValueError(f"{shown(value)} is not an amount of credits; {CREDITS_HINT}")
        amount = Decimal(value)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{shown(value)} is not a finite amount of credits; {CREDITS_HINT}")
        amount = value
    else:
        raise ValueError(f"{shown(value)} is not an amount of credits; {CREDITS_HINT}")
    # Comparison is exact for any Decimal, so a huge exponent is caught before
    # any arithmetic could round it.
    if abs(amount) > _MAX_CREDITS:
        raise ValueError(f"{shown(value)} is out of range (at most {_MAX_CREDITS} credits)")
    sign, digits, exponent = amount.as_tuple()
    assert isinstance(exponent, int)
    digits = list(digits)
    while exponent < -CREDIT_DECIMALS and digits and digits[-1] == 0:
        digits.pop()
        exponent += 1
    if exponent < -CREDIT_DECIMALS:
        raise ValueError(f"{shown(value)} has more than {CREDIT_DECIMALS} decimals; {CREDITS_HINT}")
    magnitude = int("".join(map(str, digits)) or "0") * 10 ** (exponent + CREDIT_DECIMALS)
    return -magnitude if sign else magnitude


def format_credits(ucr: int) -> str:
    """Decimal text with 6 decimals: 12_500_000 -> "12.500000"."""
    if isinstance(ucr, bool) or not isinstance(ucr, int):
        raise ValueError(f"micro-credits are an integer, got {shown(ucr)}")
    whole, frac = divmod(abs(ucr), UCR_PER_CREDIT)
    return f"{'-' if ucr < 0 else ''}{whole}.{frac:06d}"


def credits_text(ucr: int) -> str:
    """Shortest exact decimal text of an amount: 1_200_000 -> "1.2", 8_000_000 -> "8"."""
    text = format_credits(ucr).rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


MS_PER_HOUR = 3_600_000
# The highest price a profile may have, in µcr per hour (1,000,000 credits an
# hour): a session's charge must fit the ledger's 64-bit column however long it
# runs, and at this price it would take over 1,000 years to overflow it.
MAX_PRICE_PER_HOUR_UCR = 10**12


def seconds_text(ms: int) -> str:
    """Milliseconds as seconds with three decimals, as pages and notes show a
    billed length: 4800 -> "4.800"."""
    ms = int(ms)
    return f"{'-' if ms < 0 else ''}{abs(ms) // 1000}.{abs(ms) % 1000:03d}"


def ms_cost(ms: int, rate_per_hour_ucr: int) -> int:
    """µcr for `ms` milliseconds at an hourly rate: ceil(ms × rate / 3,600,000), in
    integers. A session is billed with this once, over its whole length: the one
    rounding it gets."""
    if ms < 0 or rate_per_hour_ucr < 0:
        raise ValueError(f"milliseconds and rate must not be negative: {ms}, "
                         f"{rate_per_hour_ucr}")
    return -(-ms * rate_per_hour_ucr // MS_PER_HOUR)


def rate_cost(seconds: int, rate_per_hour_ucr: int) -> int:
    """µcr for whole `seconds` at an hourly rate, rounded up to the next µcr (a
    minimum run's hold; sessions are billed by the millisecond, `ms_cost`)."""
    if seconds < 0:
        raise ValueError(f"seconds must not be negative: {seconds}")
    return ms_cost(seconds * 1000, rate_per_hour_ucr)


class _ExactLoader(yaml.SafeLoader):
    """safe_load, but floats become exact Decimals and duplicate keys are errors."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # unhashable key: let PyYAML report it
                    continue
                if duplicate:
                    # PyYAML would silently keep the last value; an admin's
                    # copy-paste slip should not decide a price.
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key!r}", key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


def _construct_decimal(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Decimal:
    text = loader.construct_scalar(node).replace("_", "").lower()
    sign = "-" if text.startswith("-") else ""
    text = text.lstrip("+-")
    if text == ".inf":
        return Decimal(sign + "Infinity")
    if text == ".nan":
        return Decimal("NaN")
    if ":" in text:  # YAML 1.1 base-60 float, e.g. 1:30.5
        total = Decimal(0)
        for part in text.split(":"):
            total = total * 60 + Decimal(part)
        return total.copy_negate() if sign else total
    # Built from the text, not by arithmetic, so no digit is rounded away.
    return Decimal(sign + text)


_ExactLoader.add_constructor("tag:yaml.org,2002:float", _construct_decimal)


def load_yaml(text: str) -> object:
    """Parse YAML like yaml.safe_load, with floats as exact Decimals."""
    return yaml.load(text, Loader=_ExactLoader)  # noqa: S506 - a SafeLoader subclass



def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a valid JSON number")


def json_loads(text: str | bytes) -> object:
    """json.loads with non-integer numbers as exact Decimals; NaN and Infinity refused.

    ValueError for anything that is not such JSON, also for nesting deeper than
    Python's recursion allows (a 1 MiB body can nest 500,000 lists).
    """
    try:
        return json.loads(text, parse_float=Decimal, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("it nests arrays or objects deeper than gpulease reads") from None


def load_yaml_file(path: str | Path) -> object:
    return load_yaml(Path(path).read_text(encoding="utf-8"))
