"""report.png says what the run trained, and its rate axis keeps decayed rates visible."""

import json

from scalesgd import output
from scalesgd.config import TrainConfig
from scalesgd.train import report


def fake_run(run_dir, cfg: TrainConfig):
    """A run directory as training leaves it, without training: config.json and a short metrics.jsonl."""
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    lrs = [0.1, 0.4, 0.4, 0.004, 0.0004, 0.0]  # warmup, two decays, the end of a cosine
    lines = [{"kind": "iter", "epoch": 1 + i // 3, "iter": i + 1, "lr": lr, "loss": 2.0 / (i + 1)}
             for i, lr in enumerate(lrs)]
    lines += [{"kind": "epoch", "epoch": e, "iter": 3 * e, "train_loss": 1.0, "train_acc": 0.5, "test_loss": 1.1,
               "test_acc": 0.4, "images_per_s": 100.0} for e in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_the_figure_is_titled_by_model_codec_and_batch_and_its_rate_axis_is_logarithmic(tmp_path, monkeypatch):
    cfg = TrainConfig.of(model="resnet20", codec="fp16", batch_size=512, workers=4)
    fake_run(tmp_path / "run", cfg)
    drawn = []
    plt = output.pyplot()
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (drawn.append(fig), close(fig)))
    path = report.plot_report(tmp_path / "run")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = drawn
    heading = fig._suptitle.get_text()
    assert heading == f"{report.title(cfg.to_dict())}\nrun"
    for part in ("resnet20", "codec fp16", "ddp engine", "global batch 512", "4 workers × 128"):
        assert part in heading
    lr_axis = next(ax for ax in fig.axes if ax.get_ylabel() == "learning rate")
    assert lr_axis.get_yscale() == "log"
    low, high = lr_axis.get_ylim()
    assert low < 0.0004 < 0.4 < high  # the decayed rates are on the axis, the rate of 0 is left out


def test_an_auto_run_is_titled_by_the_codec_it_chose():
    cfg = TrainConfig.of(exchange="auto", engine="scalesgd", codec="fp8").to_dict()
    assert "codec fp8 (scalesgd engine, chosen by --exchange auto)" in report.title(cfg)
    cfg = TrainConfig.of(exchange="auto", codec="fp8", local_steps=16).to_dict()  # auto switched it to periodic
    assert "fp8 pseudo-gradient every 16 steps (chosen by --exchange auto) · global batch" in report.title(cfg)


def test_the_summary_names_the_epochs_adascale_trained_beside_its_base_epochs():
    assert report.epochs_trained({"epochs": 30, "epochs_trained": 30}) == "30"
    assert report.epochs_trained({"epochs": 30}) == "30"  # a summary from before the count was kept
    assert report.epochs_trained({"epochs": 30, "epochs_trained": 57}) == "57 (--epochs 30, scale-invariant)"


def test_a_periodic_run_is_titled_by_its_rounds_and_compared_by_them():
    cfg = TrainConfig.of(local_steps=16, fragments=4, overlap_steps=3, mix=0.5, codec="fp8").to_dict()
    assert "fp8 pseudo-gradient every 16 steps, 4 fragments 3 steps behind, α 0.5" in report.title(cfg)
    assert report.periodic_text(TrainConfig.of().to_dict()) == ""
