"""Bad input around datasets, as a user trial met it: each ends in one `scalesgd: error:` line naming the value (and
the file) and what is accepted, exit status 2 (130 for Ctrl-C), no traceback, and nothing left that a later run
takes for a dataset."""

import json
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

from scalesgd import checks
from scalesgd.cli import main
from scalesgd.commands import COMMANDS
from scalesgd.data import DataError, load_image_folder
from scalesgd.checks import kernel_filesystem as _kernel_filesystem
from scalesgd.data.imagefolder import trees
from scalesgd.data.imagefolder.scan import PARTIAL_PREFIX, index_image_folder
from scalesgd.errors import UsageError
from scalesgd.train import rundir

SMALL_TREE = ["--classes", "3", "--per-class", "4", "--size", "20x16"]


@pytest.fixture(autouse=True)
def local_launch(monkeypatch):
    """Checks as a local launch makes them (not under torchrun)."""
    for name in checks.LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def one_error_line(capsys) -> str:
    """What the command said on stderr, which must be one `scalesgd: error:` line (no traceback)."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scalesgd: error: "), err
    return err


def everything_under(folder: Path) -> list[Path]:
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


def train_on(folder: Path, tmp_path: Path, *more: str) -> list[str]:
    """`scalesgd train` on an image folder, up to its validation."""
    return ["train", "--run-dir", str(tmp_path / "run"), "--dataset", "imagefolder", "--data-dir", str(folder), *more]


def fake_tree(root: Path, classes: int = 2, per_class: int = 3) -> Path:
    trees.write_fake_tree(root, classes, per_class, (20, 16), val_per_class=1)
    return root


def interrupt_after(monkeypatch, images: int) -> None:
    """Ctrl-C while the tree's images are written, after `images` of them."""
    save, count = trees._save, [0]

    def interrupted(*args, **kwargs):
        count[0] += 1
        if count[0] > images:
            raise KeyboardInterrupt
        return save(*args, **kwargs)

    monkeypatch.setattr(trees, "_save", interrupted)


# ---- 1. Ctrl-C while `data fake` or `data export` writes ----------------------------------------------------

def test_ctrl_c_during_data_fake_says_one_line_exits_130_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    interrupt_after(monkeypatch, 5)
    out = tmp_path / "new" / "tree"
    assert main(["data", "fake", "--out", str(out), *SMALL_TREE]) == 130
    assert one_error_line(capsys) == f"scalesgd: error: interrupted; nothing written to {out}\n"
    assert everything_under(tmp_path) == []  # neither the tree nor the folders made for it


def test_ctrl_c_during_data_export_into_a_folder_of_the_users_leaves_it_as_it_was(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "train").mkdir()  # empty: a tree may go here
    before = everything_under(tmp_path)
    interrupt_after(monkeypatch, 100)
    assert main(["data", "export", "digits", "--out", str(tmp_path)]) == 130
    assert "interrupted; nothing written" in one_error_line(capsys)
    assert everything_under(tmp_path) == before


def test_a_tree_whose_writing_was_cut_short_is_not_trained_on(tmp_path, monkeypatch, capsys):
    interrupt_after(monkeypatch, 5)
    monkeypatch.setattr(trees.shutil, "rmtree", lambda *a, **k: None)  # as if killed: nothing cleaned up
    out = tmp_path / "tree"
    assert main(["data", "fake", "--out", str(out), *SMALL_TREE]) == 130
    capsys.readouterr()
    [partial] = out.iterdir()  # what was written lies in a hidden folder of its own, never in train/ or val/
    assert partial.name.startswith(PARTIAL_PREFIX) and any(partial.rglob("*.JPEG"))
    assert main(train_on(out, tmp_path)) == 2
    assert f"{out} has no train/ or val/ folder" in one_error_line(capsys)
    assert main(train_on(partial, tmp_path)) == 2
    assert f"{partial} is a tree `scalesgd data` was stopped while writing" in one_error_line(capsys)


def test_a_finished_tree_is_moved_into_place_whole(tmp_path, capsys):
    out = tmp_path / "tree"
    assert main(["data", "fake", "--out", str(out), *SMALL_TREE]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["train", "val"]  # no hidden folder left behind
    assert len(list((out / "train").rglob("*.JPEG"))) == 12 and len(index_image_folder(out).classes) == 3


# ---- 2. images over Pillow's pixel limit ----------------------------------------------------------------------

@pytest.fixture
def pixel_limit(monkeypatch):
    """Pillow's decompression-bomb limit lowered to 1000 pixels: it warns above, refuses above 2000."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)


def test_an_image_over_twice_pils_pixel_limit_is_skipped_or_named(tmp_path, pixel_limit):
    root = fake_tree(tmp_path / "t")  # 20×16 = 320 pixels each
    bomb = root / "train" / "n00000000" / "bomb.png"
    Image.new("L", (50, 50)).save(bomb)  # 2500 pixels
    with pytest.raises(DataError) as err:
        index_image_folder(root)
    assert str(err.value).startswith(f"{bomb}: more than 2,000 pixels (twice Pillow's limit of 1,000)")
    assert "`skip_bad_images` leaves such files out" in str(err.value) and "\n" not in str(err.value)
    index = index_image_folder(root, skip_bad=True)
    assert [path for path, _ in index.bad] == [str(bomb)] and str(bomb) not in dict(index.train)


def test_an_image_over_pils_pixel_limit_is_a_warning_naming_it_once(tmp_path, pixel_limit, capsys, monkeypatch):
    root = fake_tree(tmp_path / "t")
    large = root / "train" / "n00000001" / "large.png"
    Image.new("L", (40, 40)).save(large)  # 1600 pixels: read, with Pillow's warning
    with warnings.catch_warnings(record=True) as raw:
        warnings.simplefilter("always")
        data = load_image_folder(root, 8)  # the pre-scan, and the channel statistics' decodes
        for _ in range(2):
            data.train[len(data.train) - 1]  # the large image read again, as every epoch does
    assert not [w for w in raw if issubclass(w.category, Image.DecompressionBombWarning)]
    err = capsys.readouterr().err
    assert err == (f"scalesgd: warning: {large} has 1,600 pixels, over Pillow's limit of 1,000 for a safe decode (a "
                   "possible decompression bomb); it is read anyway, slowly and with much memory\n")
    assert data.large == ((str(large), 1600),)
    monkeypatch.setenv("RANK", "1")  # every rank scans; rank 0 alone says it
    load_image_folder(root, 8)
    assert capsys.readouterr().err == ""


# ---- 3. symbolic links to themselves ------------------------------------------------------------------------

def test_a_class_folder_linked_to_itself_is_one_line_naming_it(tmp_path, capsys):
    root = fake_tree(tmp_path / "t")
    loop = root / "train" / "loop"
    loop.symlink_to("loop")
    assert main(train_on(root, tmp_path)) == 2
    assert (f"{loop} is a symbolic link that cannot be followed (Too many levels of symbolic links); remove it or "
            "point it at a class folder") in one_error_line(capsys)


def test_an_image_linked_to_itself_is_named_or_skipped(tmp_path):
    root = fake_tree(tmp_path / "t")
    loop = root / "val" / "n00000000" / "loop.JPEG"
    loop.symlink_to("loop.JPEG")
    with pytest.raises(DataError) as err:
        index_image_folder(root)
    assert str(err.value).startswith(f"{loop}: cannot be read (Too many levels of symbolic links); `skip_bad_images`")
    assert [path for path, _ in index_image_folder(root, skip_bad=True).bad] == [str(loop)]


# ---- 4. an image side too large to hold ---------------------------------------------------------------------

def test_an_image_size_past_4096_is_refused_with_its_reason(tmp_path, capsys):
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--dataset", "synthetic", "--image-size", "100000"]) == 2
    assert one_error_line(capsys) == ("scalesgd: error: --image-size 100000: must be in [1, 4096] (pixels a side; one "
                                      "such RGB image is 192 MiB as float32, and ImageNet's recipes crop to 224)\n")


# ---- 5. a tree written where no files can go ----------------------------------------------------------------

KERNEL_PLACES = [(command, out) for command in (["data", "fake"], ["data", "export", "digits"])
                 for out in ("/proc/x", "/sys/kernel/x")]


@pytest.mark.parametrize("command,out", KERNEL_PLACES, ids=[f"{c[1]} {o}" for c, o in KERNEL_PLACES])
def test_a_tree_in_proc_or_sys_is_refused_naming_the_folder_and_why(capsys, command, out):
    mount = "/" + out.split("/")[1]
    if _kernel_filesystem(Path(mount)) is None:
        pytest.skip(f"{mount} is not the kernel's file system here")
    assert main([*command, "--out", out]) == 2
    kind = "proc" if mount == "/proc" else "sysfs"
    assert one_error_line(capsys) == (f"scalesgd: error: --out {out}: cannot be created: {mount} is the kernel's "
                                      f"{kind} file system, not a place files can be written\n")


def test_a_folder_that_cannot_be_written_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    def refused(prefix, dir):
        raise PermissionError(13, "Permission denied", dir)

    monkeypatch.setattr(trees.tempfile, "mkdtemp", refused)  # what a folder not ours says (the tests run as root)
    out = tmp_path / "new"
    assert main(["data", "fake", "--out", str(out), *SMALL_TREE]) == 2
    assert one_error_line(capsys) == (f"scalesgd: error: --out {out}: cannot be written: permission denied ({out}); "
                                      "nothing written\n")
    assert everything_under(tmp_path) == []


# ---- 7. a text too short for the GPT's block --------------------------------------------------------------------

def test_a_too_short_text_names_gpt_block_and_the_file_and_the_bytes_needed(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 100)
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--dataset", "text", "--model", "gpt", "--data-file",
                 str(short)]) == 2
    err = one_error_line(capsys)
    assert (f"text file {short} has 100 bytes; --gpt-block 64 needs at least 650, as the last tenth of the text is "
            "kept for validation and must hold one sequence of 65 bytes") in err
    assert "give a longer text or a smaller --gpt-block" in err
    assert "sequence_length" not in err and "T+1" not in err


# ---- 8. and 9. a data folder that is no folder, a class folder with no images ----------------------------------

@pytest.mark.parametrize("dataset,what", [("imagefolder", "image folder"), ("cifar10", "CIFAR-10 folder")])
def test_a_data_dir_naming_a_file_says_it_is_a_file_not_a_folder(tmp_path, capsys, dataset, what):
    file = tmp_path / "f"
    file.write_text("a file")
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--dataset", dataset, "--data-dir", str(file)]) == 2
    assert f"scalesgd: error: {what} {file} is a file, not a folder (expected a directory " in one_error_line(capsys)


def test_a_class_folder_with_no_images_says_which_files_count(tmp_path, capsys):
    root = fake_tree(tmp_path / "t")
    empty = root / "val" / "n00000001"
    for path in empty.iterdir():
        path.unlink()
    (empty / ".DS_Store").write_bytes(b"junk")
    assert main(train_on(root, tmp_path)) == 2
    assert (f"class folder {empty} has no image files: it needs JPEG or PNG files (.JPEG, .jpg, .jpeg, .png alike: "
            "each is read by its content, whatever its name; names starting with '.' are left out)"
            ) in one_error_line(capsys)


# ---- 10. the positional DATASET of `data export` -------------------------------------------------------------

def test_data_export_names_an_unknown_dataset_as_the_positional_it_is(tmp_path, capsys):
    assert main(["data", "export", "--out", str(tmp_path / "d"), "bogus"]) == 2
    assert one_error_line(capsys) == ("scalesgd: error: DATASET 'bogus' is not one that can be exported; choose "
                                      "from digits\n")
    assert everything_under(tmp_path) == []


# ---- 11. a run's data paths, stored absolute -----------------------------------------------------------------

TEXT_RUN = {"dataset": "text", "model": "gpt", "batch_size": 8}


def configure(**options):
    """`scalesgd train`'s validated configuration for these options (by flat name)."""
    return COMMANDS["train"].configure(options).config


def stored_run(run: Path, config: dict) -> Path:
    """A run directory holding `config` as its config.json and its checkpoint's, one epoch done."""
    run.mkdir()
    (run / rundir.CONFIG_NAME).write_text(json.dumps(config))
    state = {"model": {}, "optimizer": {}, "scheduler": {}, "epoch": 1, "rng": {}, "config": config}
    torch.save(state, run / rundir.CHECKPOINT_NAME)
    return run


@pytest.fixture
def text_here(tmp_path, monkeypatch):
    """good.txt in the folder the run is started from (the current one), and another folder to resume from."""
    (tmp_path / "start").mkdir()
    (tmp_path / "elsewhere").mkdir()
    good = tmp_path / "start" / "good.txt"
    good.write_bytes(bytes(range(256)) * 40)
    monkeypatch.chdir(tmp_path / "start")
    return good


def test_a_runs_relative_data_file_is_stored_absolute_and_resumes_from_anywhere(tmp_path, text_here, monkeypatch):
    cfg = configure(**TEXT_RUN, data_file="good.txt", run_dir=str(tmp_path / "run"))
    assert cfg.data.data_file == str(text_here)
    run = rundir.prepare_new_run(cfg)
    stored = json.loads((run / rundir.CONFIG_NAME).read_text())
    assert stored["data_file"] == str(text_here)
    torch.save({"model": {}, "optimizer": {}, "scheduler": {}, "epoch": 1, "rng": {}, "config": stored},
               run / rundir.CHECKPOINT_NAME)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert configure(resume=str(run)).data.data_file == str(text_here)
    assert configure(resume=str(run), data_file=str(text_here)).data.data_file == str(text_here)  # not a change
    monkeypatch.chdir(tmp_path / "start")
    assert configure(resume=str(run), data_file="good.txt").data.data_file == str(text_here)  # the same file


def test_a_relative_data_dir_is_stored_absolute(tmp_path, monkeypatch):
    fake_tree(tmp_path / "tree", per_class=8)
    monkeypatch.chdir(tmp_path)
    cfg = configure(dataset="imagefolder", data_dir="tree", batch_size=8, run_dir="run")
    assert cfg.data.data_dir == str(tmp_path / "tree")


def test_an_old_run_with_a_relative_data_file_resumes_from_the_folder_it_is_relative_to(tmp_path, text_here,
                                                                                       monkeypatch):
    old = configure(**TEXT_RUN, data_file=str(text_here)).to_dict() | {"data_file": "good.txt"}  # as stored before
    run = stored_run(tmp_path / "run", old)
    assert configure(resume=str(run)).data.data_file == str(text_here)  # from start/, where good.txt is
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(UsageError, match="`data_file` good.txt: text file not found: good.txt"):
        configure(resume=str(run))  # elsewhere there is no good.txt: named, as the run stored it
