"""`scalesgd profile`: a run without a profile, or a file that is none, refused in one line before anything is
printed; a profile shown with its groups and prediction. (`scalesgd plan` is run by tests/test_cli.py.)"""

import json

import pytest

from scalesgd.errors import UsageError
from scalesgd.sim import plans
from tests.command import scalesgd


def test_profile_of_a_run_without_one_is_one_line(tmp_path):
    proc = scalesgd("profile", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no profile.json" in proc.stderr


def test_a_file_that_is_not_a_profile_is_refused_before_anything_is_printed(tmp_path, capsys):
    prof = {"t_f": 0.01, "world_size": 2, "density": 0.1, "reuse": 10, "sizes": [10, 20], "names": ["a", "b"],
            "t_b": [0.001, 0.002], "comm": [1e-4, 1e-9], "sparsify": [1e-5, 1e-9]}
    saved = {"profile": prof, "groups": [[1]], "predicted_iteration_s": 0.1, "predicted_unmerged_s": 0.2,
             "predicted_single_group_s": 0.3}
    (tmp_path / "profile.json").write_text(json.dumps(saved))
    with pytest.raises(UsageError, match=r"profile.json is not a profile \(no entry 0\)"):
        plans.show_profile(plans.ProfileCommand(str(tmp_path)))  # layer 0 is in no group
    assert capsys.readouterr().out == ""
    (tmp_path / "profile.json").write_text(json.dumps(saved | {"groups": [[1, 0]]}))
    plans.show_profile(plans.ProfileCommand(str(tmp_path)))
    assert "1 groups; predicted iteration 100.0 ms" in capsys.readouterr().out
