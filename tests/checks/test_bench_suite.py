"""The benchmark suite (bench/suite.py) covers every benchmark and judges its figure lines.

Running the benchmarks is CI's `make bench-quick`, after the tests; this checks, without
running any, that none is left out of it and that a run's output is read strictly.
"""

from __future__ import annotations

import ast
import io
import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from bench import suite
from bench.figures import FIGURE_LINE, declared, figure, malformed, read, target

BENCH = Path(suite.__file__).parent


def _runnable(path: Path) -> bool:
    """A script with an `if __name__ == "__main__":` block."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return True
    return False


def test_every_runnable_benchmark_is_in_the_suite_or_a_part_of_one():
    names = {b.name for b in suite.BENCHMARKS}
    runnable = {p.stem for p in BENCH.glob("*.py") if _runnable(p)} - {"suite"}
    assert runnable - names - set(suite.PARTS) == set()
    assert set(suite.PARTS.values()) <= names
    assert names <= runnable


@pytest.mark.parametrize("benchmark", suite.BENCHMARKS, ids=lambda b: b.name)
def test_each_benchmark_declares_its_figures_and_has_a_quick_mode(benchmark):
    names = declared(benchmark.script)
    assert names and len(set(names)) == len(names)
    assert all(FIGURE_LINE.match(f"{n}: 1.0") for n in names)
    assert benchmark.quick  # CI runs something small, never the full run


@pytest.mark.parametrize("part", sorted(suite.PARTS))
def test_a_part_declares_figures_its_benchmark_names_too(part):
    whole = next(b for b in suite.BENCHMARKS if b.name == suite.PARTS[part])
    assert set(declared(BENCH / f"{part}.py")) <= set(declared(whole.script))


def test_figure_and_target_lines():
    out = io.StringIO()
    with redirect_stdout(out):
        figure("spawn_ratio", 0.18234)
        figure("kube_spawn_n", 5, 0)
        figure("on_demand_wait_ratio", float("nan"))
        target("spawn_ratio", "<= 1.05")
    lines = out.getvalue().splitlines()
    assert lines == ["spawn_ratio: 0.182", "kube_spawn_n: 5", "on_demand_wait_ratio: nan",
                     "target spawn_ratio <= 1.05"]
    values = read(out.getvalue())
    assert set(values) == {"spawn_ratio", "kube_spawn_n", "on_demand_wait_ratio"}
    assert values["spawn_ratio"] == 0.182 and values["kube_spawn_n"] == 5
    assert math.isnan(values["on_demand_wait_ratio"])


def test_text_after_a_value_is_caught():
    output = ("kube_spawn_ratio: 0.592 (target <= 1.05)\n"
              "spot_utilisation_gain: 1.200  (target >= 1.05)\n"
              "placement_p99_ms: fast\n"
              "placement_median_ms: 0.010\n"
              "inventory: 1000 GPUs\n")
    names = ["kube_spawn_ratio", "spot_utilisation_gain", "placement_p99_ms",
             "placement_median_ms"]
    assert malformed(output, names) == output.splitlines()[:3]
    assert read(output) == {"placement_median_ms": 0.01}


def test_judge_names_exit_missing_and_malformed(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text('FIGURES = ("a_s", "b_ratio")\n')

    class Fake(suite.Benchmark):
        @property
        def script(self) -> Path:
            return script

    bench = Fake("fake")
    assert suite.judge(bench, 0, "a_s: 1.0\nb_ratio: 2.0\n  a_s table: 3\n") == []
    problems = suite.judge(bench, 3, "a_s: 1.0 (target <= 2)\n")
    assert problems == ["exit status 3", "figures not printed: a_s, b_ratio",
                        "not `name: value` lines: a_s: 1.0 (target <= 2)"]
    assert suite.judge(bench, 0, "a_s: 1.0\n  b_ratio: 2.0\n") == [
        "figures not printed: b_ratio", "not `name: value` lines:   b_ratio: 2.0"]
    assert suite.judge(bench, 0, "a_s: 1.0\nb_ratio: 2.0\na_s: 1.5\nc_ms: 4\n") == [
        "printed more than once: a_s", "figure lines not in its FIGURES: c_ms"]


def test_declared_refuses_a_computed_list(tmp_path):
    script = tmp_path / "computed.py"
    script.write_text('FIGURES = tuple(f"x_{i}" for i in range(3))\n')
    with pytest.raises(ValueError):
        declared(script)
    (tmp_path / "none.py").write_text("X = 1\n")
    with pytest.raises(ValueError, match="declares no FIGURES"):
        declared(tmp_path / "none.py")


def _figure_like_prints(script: Path, names: set[str]) -> list[str]:
    """print() calls of a script that write a figure line themselves: a string starting
    with a declared name and a colon, or with a formatted name and a colon
    (f"{name}: {value}", as bench/billing.py once printed its figures and targets)."""
    found = []
    for node in ast.walk(ast.parse(script.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print"
                and node.args):
            continue
        first = node.args[0]
        while isinstance(first, ast.BinOp):  # "..." + "...": its first part
            first = first.left
        parts = first.values if isinstance(first, ast.JoinedStr) else [first]
        head = parts[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            if head.value.lstrip("\n").split(":")[0] in names:
                found.append(ast.unparse(node.args[0]))
        elif [type(p) for p in parts[:3]] == [ast.FormattedValue, ast.Constant,
                                               ast.FormattedValue] \
                and parts[1].value == ": " and len(parts) == 3:  # f"{name}: {value}"
            found.append(ast.unparse(node.args[0]))
    return found


@pytest.mark.parametrize("script", sorted(p for p in BENCH.glob("*.py") if _runnable(p)),
                         ids=lambda p: p.stem)
def test_figures_are_printed_only_through_figure(script):
    """A bare print of `name: ...` is how text after a value crept in: figure() only."""
    names = set()
    for b in suite.BENCHMARKS:
        names |= set(declared(b.script))
    assert _figure_like_prints(script, names) == []


def test_a_figure_printed_by_hand_is_found(tmp_path):
    script = tmp_path / "old.py"
    script.write_text('for name, value in figures.items():\n'
                      '    print(f"{name}: {value:.3f}" + " (target <= 1)")\n'
                      'print(f"kube_spawn_ratio: {r:.3f} (target <= 1.05)")\n'
                      'print("spawn_ratio: 1")\nprint(f"  {name}: fine, indented")\n')
    assert len(_figure_like_prints(script, {"kube_spawn_ratio", "spawn_ratio"})) == 3


@pytest.mark.parametrize("benchmark", suite.BENCHMARKS, ids=lambda b: b.name)
def test_each_option_the_suite_passes_is_one_the_script_takes(benchmark):
    source = benchmark.script.read_text()
    for arg in (*benchmark.full, *benchmark.quick):
        if arg.startswith("--"):
            assert f'"{arg}"' in source, f"bench/{benchmark.name}.py takes no {arg}"


def test_the_suite_says_what_is_missing_before_it_runs_anything(monkeypatch, capsys):
    monkeypatch.setattr(suite, "missing_tools", lambda: ["kwok"])
    monkeypatch.setattr(suite, "given_url", lambda _url: None)
    monkeypatch.setattr(suite, "server_binaries", lambda: False)
    monkeypatch.setattr(suite, "run_one", lambda *_: pytest.fail("ran a benchmark"))
    assert suite.main(["--quick"]) == 2
    said = capsys.readouterr().err
    assert "billing, kube_spawn, placement_real, dynamic_mig need kwok" in said
    assert "apt-get install postgresql" in said
    tiers = next(b for b in suite.BENCHMARKS if b.name == "tiers")
    assert suite.missing_parts([tiers]) == []
