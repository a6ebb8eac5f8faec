"""Errors name configuration fields in backticks; the command line shows them as its flags."""

from scalesgd.errors import as_flags, option_name


def test_fields_in_backticks_become_flags_and_nothing_else_changes():
    assert option_name("batch_size") == "--batch-size"
    assert as_flags("`batch_size` 9 does not divide evenly by `workers` 2") == \
        "--batch-size 9 does not divide evenly by --workers 2"
    assert as_flags("run `scalesgd train --planner dlgs` first; 'fp7' is not known") == \
        "run `scalesgd train --planner dlgs` first; 'fp7' is not known"
