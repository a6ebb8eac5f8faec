"""`scalesgd bench data` end to end on a tiny generated tree: rates per loader worker, the step's, workers needed."""

import json
import math
import statistics

from scalesgd.data.imagefolder.trees import write_fake_tree
from tests.bench.cli import bench


def test_bench_data_measures_each_loader_worker_count_and_says_how_many_the_step_needs(tmp_path):
    write_fake_tree(tmp_path / "tree", 2, 12, (40, 30))
    out = tmp_path / "bench"
    proc = bench("data", "--data-dir", str(tmp_path / "tree"), "--image-size", "16", "--loader-workers", "0,1",
                 "--batch", "4", "--batches", "2", "--rounds", "2", "--model", "resnet8", "--steps", "1",
                 "--device", "cpu", "--step-rate", "5000", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "data.json").read_text())
    rows = {r["loader_workers"]: r for r in record["pipeline"]}
    assert sorted(rows) == [0, 1] and all(len(r["images_per_s"]) == 2 and min(r["images_per_s"]) > 0
                                          for r in rows.values())
    per_worker = record["per_loader_worker_images_per_s"]
    assert per_worker == statistics.median(rows[1]["per_worker"])  # one process: its own rate, not a shared one
    assert record["workers_needed_projected"] == math.ceil(5000 / per_worker)
    assert record["workers_needed_here"] == math.ceil(record["model_images_per_s"] / per_worker)
    assert record["model_device"] == "CPU" and "resnet8's step (fp32, CPU):" in proc.stdout
    assert "loader worker(s) keep it fed" in proc.stdout
    assert (out / "data.md").read_text().startswith("`scalesgd bench data --data-dir")
