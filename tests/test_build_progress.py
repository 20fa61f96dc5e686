"""The warm-start builds' progress lines: an estimate of the time left, at a bounded rate."""

from __future__ import annotations

from dapo.tasks.build_progress import BuildProgress, duration, progress_line


def test_duration_reads_at_every_scale():
    assert [duration(s) for s in (0, 42.4, 60, 185, 3599, 3720, 7322)] == [
        "0 s", "42 s", "1 min 00 s", "3 min 05 s", "59 min 59 s", "1 h 02 min", "2 h 02 min",
    ]  # fmt: skip


def test_the_estimate_is_the_mean_step_time_times_the_steps_left():
    # 100 of 800 steps in 50 s: 0.5 s a step, 700 left -> 350 s
    assert progress_line("warm start", 100, 800, 0.4391, 50.0) == (
        "  warm start step 100/800 loss 0.439 (50 s, about 5 min 50 s left)"
    )
    assert (
        progress_line("warm start", 800, 800, 0.1, 400.0)
        == "  warm start step 800/800 loss 0.100 (6 min 40 s, done)"
    )


def test_a_line_at_most_every_interval_and_after_the_last_step():
    now = [0.0]
    lines: list[str] = []
    losses: list[int] = []
    p = BuildProgress("warm start", 10, lines.append, every_s=15.0, clock=lambda: now[0])

    def loss(step: int):
        return lambda: losses.append(step) or 1.0

    for step in range(1, 11):
        now[0] += 4.0  # 4 s a step: a line after steps 4 (16 s), 8 (32 s) and the last, 10 (40 s)
        p.step(step, loss(step))
    assert losses == [4, 8, 10]  # the loss is read only for a printed line
    assert lines == [
        "  warm start step 4/10 loss 1.000 (16 s, about 24 s left)",
        "  warm start step 8/10 loss 1.000 (32 s, about 8 s left)",
        "  warm start step 10/10 loss 1.000 (40 s, done)",
    ]
