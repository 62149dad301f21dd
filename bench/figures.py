"""The benchmarks' figure lines: `name: value` and nothing after the value.

Every benchmark declares the figures it prints (`FIGURES`, a module-level tuple of
names) and prints each with `figure`. Tools, bench/suite.py and
the CI's quick run read a benchmark's figures as the lines that match
FIGURE_LINE. A target is a line of its own that is not a figure line
(`target NAME RULE`), so a reader sees it and a parser skips it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

# A value is a decimal number, or nan where the run left it undefined (a ratio over 0).
FIGURE_LINE = re.compile(r"^([a-z][a-z0-9_]*): (-?[0-9]+(?:\.[0-9]+)?|nan)$")


def figure(name: str, value: float, digits: int = 3) -> None:
    """Print one figure line: `name: value`, `digits` after the point (0: an integer)."""
    shown = f"{value:.{digits}f}" if digits else f"{round(value)}"
    print(f"{name}: {shown}", flush=True)


def target(name: str, rule: str) -> None:
    """Print a figure's target on a line of its own (`target spawn_ratio <= 1.05`)."""
    print(f"target {name} {rule}", flush=True)


def figure_lines(text: str) -> list[tuple[str, float]]:
    """Every figure line of a benchmark's output, in order (a figure line starts at the
    line's first column: indented text is a benchmark's own table)."""
    return [(m.group(1), float(m.group(2)))
            for m in map(FIGURE_LINE.match, text.splitlines()) if m]


def read(text: str) -> dict[str, float]:
    """The figures in a benchmark's output, by name (the last line of a name wins)."""
    return dict(figure_lines(text))


def malformed(text: str, names: Iterable[str]) -> list[str]:
    """Lines that begin like a named figure (`name:`) but are not a figure line: text
    after the value, a value that is not a number, an indented figure."""
    prefixes = tuple(f"{name}:" for name in names)
    return [line for line in text.splitlines()
            if line.strip().startswith(prefixes) and not FIGURE_LINE.match(line)]


def declared(script: Path) -> tuple[str, ...]:
    """A benchmark script's FIGURES, read from its source (nothing of it is imported)."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "FIGURES" for t in node.targets):
            names = ast.literal_eval(node.value)
            if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{script}: FIGURES must be a tuple of names")
            return names
    raise ValueError(f"{script}: declares no FIGURES (the names of the figures it prints)")
