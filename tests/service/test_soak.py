"""A bounded soak of the agent process (``tests/bench/soak_agent.py`` runs longer ones)."""

from __future__ import annotations

from .soak import run_soak


def test_a_soak_with_hostile_clients_and_sigkills_loses_and_doubles_nothing(tmp_path):
    """12 clients (a quarter hostile), SIGKILL every 2-5 s for 30 s: see tests/service/soak.py."""
    report = run_soak(tmp_path, duration=30, clients=12, seed=12, kill_every=(2.0, 5.0))
    print("\n".join(report.lines()))
    assert report.restarts >= 2
    assert report.acked > 0
    assert (report.lost, report.duplicated, report.gaps) == (0, 0, 0)
    assert report.replay_mismatches == []
    assert report.wrong_answers == []
    assert report.exits_on_input == 0
    assert report.final_exit == 0
    assert report.peak_rss_kib < report.start_rss_kib + 100 * 1024
