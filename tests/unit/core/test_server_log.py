"""A server's own log (gpulease/core/server_log.py): its path, its rotation, what is shown."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from gpulease.core.server_log import (
    TAIL_BYTES,
    TAIL_LINES,
    Rotation,
    log_path,
    renames,
    rotation_problem,
    server_name_problem,
    shown_tail,
    shown_text,
    tail,
)

ROOT = PurePosixPath("/srv/state")


# --- where a log is --------------------------------------------------------------------

def test_each_server_has_its_file_in_its_users_folder():
    assert log_path(ROOT, "ada", "") == ROOT / "logs/servers/ada/_default.log"
    assert log_path(ROOT, "ada", "train-1") == ROOT / "logs/servers/ada/train-1.log"
    # a named server called "default" is not the default server
    assert log_path(ROOT, "ada", "default") != log_path(ROOT, "ada", "")


@pytest.mark.parametrize("user, server", [
    ("..", ""), ("ada/..", ""), ("Ada", ""), ("", ""), ("root", ""),
    ("ada", ".."), ("ada", "a/b"), ("ada", "_default"), ("ada", "A"), ("ada", "a--b"),
    ("ada", "-a"), ("ada", "a" * 64), ("ada", None),
])
def test_a_name_outside_the_rules_is_never_a_path(user, server):
    with pytest.raises(ValueError, match="not allowed|reserved|must be"):
        log_path(ROOT, user, server)


def test_a_bad_server_name_is_named_with_the_rule():
    said = server_name_problem("a/../b")
    assert "'a/../b'" in said and "lowercase letters" in said
    assert server_name_problem("") == "" and server_name_problem("gpu-2") == ""


# --- rotation --------------------------------------------------------------------------

def test_a_rotation_drops_the_oldest_then_shifts_the_rest_oldest_first():
    removed, moves = renames("x.log", 3)
    assert removed == "x.log.3"
    assert moves == [("x.log.2", "x.log.3"), ("x.log.1", "x.log.2"), ("x.log", "x.log.1")]
    assert renames("x.log", 0) == ("x.log", [])  # nothing kept: the file just starts again


@pytest.mark.parametrize("max_bytes, keep, wrong", [
    (1000, 2, "server_log_max_bytes"), (2 ** 31, 2, "server_log_max_bytes"),
    (True, 2, "server_log_max_bytes"), (65536, -1, "server_log_keep"),
    (65536, 101, "server_log_keep"), (65536, "2", "server_log_keep"),
])
def test_a_rotation_outside_its_bounds_is_refused_naming_them(max_bytes, keep, wrong):
    said = rotation_problem(max_bytes, keep)
    assert said.startswith(wrong) and repr(max_bytes if "bytes" in wrong else keep) in said
    with pytest.raises(ValueError, match=wrong):
        Rotation(max_bytes, keep)


def test_the_default_rotation_is_allowed():
    assert rotation_problem(Rotation().max_bytes, Rotation().keep) == ""


# --- the tail: the kubelet's rule ----------------------------------------------------------

def test_the_tail_is_the_last_80_lines():
    data = b"".join(b"line %d\n" % i for i in range(200))
    kept = tail(data)
    assert kept.splitlines() == [b"line %d" % i for i in range(120, 200)]
    assert len(kept.splitlines()) == TAIL_LINES


def test_the_tail_is_at_most_2048_bytes_keeping_the_end():
    data = b"".join(b"%04d" % i + b"x" * 95 + b"\n" for i in range(60))  # 100 bytes a line
    kept = tail(data)
    assert len(kept) == TAIL_BYTES and kept.endswith(b"0059" + b"x" * 95 + b"\n")


def test_a_last_line_without_its_newline_counts():
    assert tail(b"a\nb\nc", 2) == b"b\nc"
    assert tail(b"a\nb\nc\n", 2) == b"b\nc\n"
    assert tail(b"only", 5) == b"only"
    assert tail(b"", 5) == b"" and tail(b"a\n", 0) == b""


# --- what is shown -----------------------------------------------------------------------

def test_colours_titles_links_and_resets_are_taken_out():
    written = (b"\x1b[1;31mred\x1b[0m \x1b]0;a title\x07\x1b]8;;http://x.test\x1b\\link"
               b"\x1b]8;;\x1b\\ \x1bc\x1b(B\x1b7\x1b8done")
    assert shown_text(written) == "red link done"


def test_control_characters_are_taken_out_but_tabs_and_newlines_stay():
    assert shown_text(b"a\tb\nc\x00d\x07e\x08f\x7fg\x1b") == "a\tb\ncdefg"


def test_eight_bit_controls_and_sequences_are_taken_out():
    # U+009B is CSI, U+009D OSC (UTF-8 encoded, as a terminal in UTF-8 reads them)
    assert shown_text("a\u009b31mb\u009d0;title\u009cc\u0085d".encode()) == "abcd"


def test_text_that_reorders_itself_on_screen_is_shown_in_written_order():
    assert shown_text("name\u202egnp.exe".encode()) == "namegnp.exe"


def test_a_line_rewritten_with_carriage_returns_shows_its_last_text():
    assert shown_text(b"10%\r50%\r100%\ndone\r\n") == "100%\ndone\n"
    assert shown_text(b"end\r") == "end"


def test_bytes_that_are_no_utf8_are_replaced_not_fatal():
    assert shown_text(b"caf\xe9 ok") == "caf\ufffd ok"


def test_an_escape_sequence_cut_by_the_tail_leaves_no_control():
    assert shown_text(b"ok \x1b[38;5") == "ok "  # the rest was past the end
    assert "\x1b" not in shown_text(b"\x1b]0;never ended")


def test_the_shown_tail_is_the_stripped_end_without_blank_ends():
    data = b"\n".join(b"noise %d" % i for i in range(100)) + b"\n\x1b[31mValueError: boom\x1b[0m\n\n"
    shown = shown_tail(data)
    assert shown.endswith("ValueError: boom") and "\x1b" not in shown
    assert "noise 0\n" not in shown and shown.count("\n") <= TAIL_LINES


def test_a_string_sequence_never_ended_hides_no_later_line():
    """An OSC or DCS without its end (a title cut short, a crash mid-sequence) is taken out
    to the end of its line, not of the log: the lines after it, the traceback that
    explains the failure or gpulease's own notes among them, are still shown."""
    written = b"\x1b]0;title never ended\nTraceback: the real error\n[gpulease] a note\n"
    assert shown_text(written) == "\nTraceback: the real error\n[gpulease] a note\n"
    assert shown_text("\u009d0;t\nnext\n".encode()) == "\nnext\n"
    assert shown_text(b"a\x1bPq#0\nb\n") == "a\nb\n"
    assert shown_text(b"ok \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ end") == "ok link end"
