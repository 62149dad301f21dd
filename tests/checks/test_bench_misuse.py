"""bench/misuse.py replays its simulated servers through gpulease's misuse rules: a small
run keeps what the rules promise (no honest server stopped, the GPU signal never the
reason for a stop, every miner a process or payload signal can see stopped) and the
figures it prints are the ones it declares."""

from bench.misuse import FIGURES, HONEST, MINERS, VISIBLE, run


def test_a_small_week(capsys):
    figures = run(seed=3, scale=0.1, scan_s=20.0)
    assert set(figures) == set(FIGURES)
    assert figures["abuse_false_positive_rate"] == 0.0
    assert all(figures[f"abuse_false_positive_rate_{k}"] == 0.0 for k in HONEST)
    assert all(figures[f"abuse_detection_recall_{k}"] == 1.0 for k in VISIBLE)
    assert set(VISIBLE) < set(MINERS)
    assert figures["abuse_time_to_stop_p95_s"] <= 20.0 + 5.0 + 5.0  # a scan, connect, stop
    assert figures["abuse_warnings_per_honest_server_hour"] > 0  # unattended runs warned
    table = capsys.readouterr().out
    assert "unattended" in table and "tls_pool" in table
