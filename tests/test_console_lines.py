"""The training console's text: step lines that break only between fields, readable validation
names, the two accuracies, the bar's round text (hand-built metrics, no model)."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from dapo.outputs.progress import logging_through, round_info
from dapo.outputs.tracking import ConsoleTracker, _field_lines, step_fields, validation_fields
from dapo.sampling.step_stats import generated_acc

STEP = {
    "train/num_gen_batches": 2.0,
    "dynamic_sampling/kept_groups": 13.0,
    "dynamic_sampling/trained_groups": 16.0,
    "dynamic_sampling/carried_in": 3.0,
    "dynamic_sampling/filtered_all_correct": 1.0,
    "dynamic_sampling/filtered_all_wrong": 18.0,
    "dynamic_sampling/skipped_prompts": 0.0,
    "train/acc_generated": 0.148,
    "train/acc": 0.297,
    "critic/score/mean": -0.5,
    "response_length/mean": 10.66,
    "timing_s/step": 1.25,
}


def test_step_fields_name_both_accuracies_and_the_batch_sum():
    assert step_fields(7, STEP) == [
        "step 7",
        "rounds 2",
        "groups 16 = 13 new + 3 carried",
        "kept 13",
        "filtered 1 right/18 wrong",
        "acc(all) 0.148",
        "acc(kept) 0.297",
        "score -0.500",
        "len 10.7",
        "time 1.2 s",
    ]


@given(
    st.lists(st.text(alphabet="abc ()/=+-.0123456789", min_size=1, max_size=30), min_size=1, max_size=20),
    st.integers(min_value=20, max_value=200),
)
def test_field_lines_fit_the_width_and_never_split_a_field(fields, width):
    fields = [f.strip() or "x" for f in fields]
    lines = _field_lines(fields, width)
    for line in lines:
        # a line is only longer than the width when one field alone is
        assert len(line) < width or len(line.strip().split(" | ")) == 1
    assert " | ".join(x.strip() for x in lines) == " | ".join(fields)


def test_validation_fields_are_readable_per_source():
    m = {
        "val-core/arithmetic/acc/mean@4": 0.25,
        "val-core/arithmetic/acc/best@4/mean": 0.5,
        "val-core/arithmetic/acc/best@4/std": 0.1,
        "val-core/arithmetic/acc/maj@4/mean": 0.3125,
        "val-core/lighteval/MATH/reward/mean@1": 0.75,
        "val-aux/arithmetic/acc/worst@4/mean": 0.0,
    }
    assert validation_fields(m) == [
        ["validation arithmetic: accuracy 0.250 (mean of 4)", "best of 4 0.500", "majority of 4 0.312"],
        ["validation lighteval/MATH: reward 0.750 (mean of 1)"],
    ]


def test_validation_alone_is_one_line_per_source_under_its_step():
    m = {"val-core/a/acc/mean@2": 0.5, "val-core/a/acc/best@2/mean": 1}
    lines = []
    ConsoleTracker(lines.append, width=80).log(m, 0)
    assert lines == ["step 0 validation a: accuracy 0.500 (mean of 2) | best of 2 1.000"]
    lines.clear()
    ConsoleTracker(lines.append, width=60).log(m, 0)  # 66 characters: broken between fields
    assert lines == ["step 0 validation a: accuracy 0.500 (mean of 2)", "    best of 2 1.000"]


def test_generated_acc_weighs_every_response():
    groups = [{"mean": 1.0, "n": 4}, {"mean": 0.0, "n": 4}, {"mean": 0.5, "n": 8}, {"mean": None, "n": 4}]
    assert generated_acc(groups) == (4 + 0 + 4) / 16
    assert generated_acc([{"mean": None, "n": 4}]) is None


def test_round_info_says_what_the_pool_holds():
    info = {"round": 2, "kept": 18, "target": 16, "pool": 5, "filtered": 6, "skipped_prompts": 0}
    assert round_info(info) == "round 2 · groups 18/16 (5 pooled) · filtered 6"


def test_log_records_print_through_the_console_while_the_bar_is_live(capsys):
    from rich.console import Console

    printed = []

    class Recorder(Console):
        def print(self, *objects, **kw):
            printed.append(" ".join(map(str, objects)))

    root = logging.getLogger()
    plain = logging.StreamHandler()  # what logging.basicConfig installs (stderr)
    root.addHandler(plain)
    try:
        with logging_through(Recorder()):
            assert plain not in root.handlers
            logging.getLogger("dapo.test").warning("pool is empty")
        assert plain in root.handlers
    finally:
        root.removeHandler(plain)
    assert printed == ["pool is empty"]


def test_third_party_bars_are_off_unless_asked_for(monkeypatch):
    from transformers.utils import logging as hf_logging

    from dapo.outputs.progress import THIRD_PARTY_BARS_ENV, quiet_third_party_bars

    try:
        hf_logging.enable_progress_bar()
        monkeypatch.setenv(THIRD_PARTY_BARS_ENV, "1")
        quiet_third_party_bars()
        assert hf_logging.is_progress_bar_enabled()
        monkeypatch.delenv(THIRD_PARTY_BARS_ENV)
        monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
        quiet_third_party_bars()
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_a_skip_count_above_the_data_size_says_how_many_passes_it_took():
    pool = {
        "dynamic_sampling/coverage/rolled_out_prompts": 30.0,
        "dynamic_sampling/coverage/never_rolled_out": 2.0,
    }
    # 8865 skipped + 80 rolled out = 8945 draws of 32 prompts: 279.5 passes
    many = {
        **STEP,
        **pool,
        "dynamic_sampling/skipped_prompts": 8865.0,
        "dynamic_sampling/generated_groups": 80.0,
    }
    assert "skipped 8865 draws (280 passes over 32 prompts)" in step_fields(3, many)
    few = {**many, "dynamic_sampling/skipped_prompts": 20.0, "dynamic_sampling/generated_groups": 28.0}
    assert "skipped 20 draws (1.5 passes over 32 prompts)" in step_fields(3, few)  # 48 / 32
    once = {**many, "dynamic_sampling/skipped_prompts": 3.0, "dynamic_sampling/generated_groups": 29.0}
    assert "skipped 3" in step_fields(3, once)  # 32 draws: no prompt was drawn twice
    no_pool = {**STEP, "dynamic_sampling/skipped_prompts": 8865.0}
    assert "skipped 8865" in step_fields(3, no_pool)  # the pool's size is unknown
    assert round_info({"round": 4, "skipped_prompts": 240}) == "round 4 · skipped 240 draws"
