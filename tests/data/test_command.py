"""`scalesgd data fake` and `scalesgd data export`: trees written as asked, a user's data never overwritten."""

from PIL import Image

from scalesgd.cli import main


def test_data_fake_writes_jpegs_of_the_size_asked(tmp_path, capsys):
    assert main(["data", "fake", "--out", str(tmp_path / "t"), "--classes", "2", "--per-class", "5",
                 "--size", "40x30"]) == 0
    assert "wrote 10 training and 2 validation images of 2 classes" in capsys.readouterr().out
    with Image.open(next((tmp_path / "t" / "train" / "n00000001").iterdir())) as image:
        assert (image.format, image.size) == ("JPEG", (40, 30))


def test_data_export_writes_the_digits_tree_and_refuses_to_overwrite_it(tmp_path, capsys):
    assert main(["data", "export", "digits", "--out", str(tmp_path / "d")]) == 0
    assert "wrote 1,437 training and 360 validation images of 10 classes" in capsys.readouterr().out
    assert main(["data", "export", "digits", "--out", str(tmp_path / "d")]) == 2
    assert "already holds files; give a new or empty folder" in capsys.readouterr().err


def test_data_export_without_a_dataset_exports_its_default_as_the_help_says(tmp_path, capsys):
    assert main(["data", "export", "--out", str(tmp_path / "d")]) == 0
    assert "wrote 1,437 training and 360 validation images of 10 classes" in capsys.readouterr().out
