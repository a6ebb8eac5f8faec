"""The rules single values are checked against, and how they word what is wrong."""

import math
import os
import socket

from scalesgd import checks


def test_each_rule_accepts_its_range_and_words_the_rest():
    assert checks.positive(1e-9) is None and checks.positive(0) == "must be a positive number"
    assert checks.positive(math.nan) and checks.positive(math.inf)
    assert checks.at_least(1, "steps")(0) == "must be >= 1 (steps)" and checks.at_least(1)(1) is None
    half_open = checks.within(0, 1, low_open=True)
    assert half_open(1) is None and half_open(0) == "must be in (0, 1]"
    assert checks.within(0, 1, high_open=True)(1) == "must be in [0, 1)"
    assert checks.finite_non_negative(0.0) is None and checks.finite_non_negative(-1.0)
    assert checks.distinct(()) == "give at least one" and checks.distinct((1, 1)) == "give each value once"
    assert checks.each_once(()) is None


def test_problems_collect_what_breaks_its_rule():
    rules = {"a": checks.positive, "b": checks.at_least(2)}
    assert checks.problems({"a": 1, "b": 1}, rules) == {"b": "must be >= 2"}


def test_numbers_must_be_finite_and_whole_numbers_fit_in_64_bits():
    assert checks.finite(1.5) is None and checks.finite((1, 2.0)) is None and checks.finite(True) is None
    assert checks.finite(math.nan) == checks.finite(-math.inf) == checks.finite((1.0, math.inf)) == \
        "must be a finite number"
    assert checks.finite(2**63 - 1) is None and "64 bits" in checks.finite(-2**63)
    assert checks.positive(10**400) is None and checks.finite_non_negative(10**400) is None  # no OverflowError


def test_seeds_timeouts_and_threads_have_their_ranges():
    assert checks.seed(2**32 - 1) is None and checks.seed(2**32) == "must be in [0, 4294967295] (numpy's seed range)"
    assert checks.seed(-1)
    assert checks.timeout(300.0) is None and checks.timeout(7 * 24 * 3600.0) is None
    for bad in (0.0, 1e300, math.nan, math.inf):
        assert checks.timeout(bad) == "must be in (0, 604800] (seconds, at most 7 days)"
    cores = os.cpu_count()
    assert checks.threads()(cores) is None and checks.threads(1)(0)
    assert f"this machine has {cores} cores" in checks.threads(0, "0 picks")(cores + 1)


def test_each_and_all_of_combine_rules():
    assert checks.each(checks.seed)((1, 2)) is None and checks.each(checks.seed)((1, -2)).startswith("-2 must be")
    rule = checks.all_of(checks.distinct, checks.each(checks.positive))
    assert rule(()) == "give at least one" and rule((1, 0)) == "0 must be a positive number" and rule((1,)) is None


def test_an_output_directory_must_not_be_or_lie_under_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    assert checks.output_dir("") is None and checks.output_dir(str(tmp_path)) is None
    assert checks.output_dir(str(tmp_path / "new" / "deeper")) is None
    assert checks.output_dir(str(tmp_path / "f")) == "exists and is not a directory; give a new or existing directory"
    assert checks.output_dir(str(tmp_path / "f" / "sub")).startswith(f"{tmp_path / 'f'} exists and is not a directory")


def test_a_file_written_at_the_end_needs_its_folder_now(tmp_path):
    assert checks.output_file("") is None and checks.output_file(str(tmp_path / "t.json")) is None
    assert checks.output_file(str(tmp_path)) == "is a directory; give a file path"
    assert "does not exist" in checks.output_file(str(tmp_path / "nodir" / "t.json"))


def test_memory_is_read_from_meminfo_and_refused_beyond_it(tmp_path, monkeypatch):
    (tmp_path / "meminfo").write_text("MemTotal: 8000 kB\nMemAvailable:    2048 kB\n")
    assert checks.available_memory(tmp_path / "meminfo") == 2 << 20
    assert checks.available_memory(tmp_path / "nothing") is None
    monkeypatch.setattr(checks, "available_memory", lambda: 3 << 30)
    assert checks.fits_in_memory(3 << 30) is None
    assert checks.fits_in_memory(5 << 40) == "5 TiB needed, 3 GiB of memory available"
    assert checks.bytes_text(10**30).endswith("EiB") and checks.bytes_text(512) == "512 B"


def local(monkeypatch):
    for name in checks.LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_local_workers_are_capped_by_memory_and_256_not_under_torchrun(monkeypatch):
    local(monkeypatch)
    monkeypatch.setattr(checks, "available_memory", lambda: 3 * checks.WORKER_BYTES)
    assert checks.local_workers(3) is None and checks.local_workers(0) == "must be a positive number"
    assert checks.local_workers(4) == ("must be at most 3 for a local launch (each worker takes about 512 MiB and "
                                       "1.5 GiB of memory is available)")
    monkeypatch.setattr(checks, "available_memory", lambda: None)
    assert checks.local_workers(256) is None and "at most 256" in checks.local_workers(257)
    assert checks.processes_here(4) == 4
    for name in checks.LAUNCH_VARIABLES:
        monkeypatch.setenv(name, "1")
    assert checks.local_workers(10000) is None and checks.processes_here(4) == 1


def test_a_local_launch_is_capped_by_the_gpus_pytorch_sees_and_a_config_is_not(monkeypatch):
    from scalesgd.config import TrainConfig

    local(monkeypatch)
    monkeypatch.setattr(checks, "available_memory", lambda: None)
    monkeypatch.setattr(checks, "gpus_here", lambda: 1)
    assert checks.gpus_problem(1) is None
    assert checks.gpus_problem(16) == ("must be at most 1 here: each worker trains on a GPU of its own and PyTorch "
                                       "sees 1; or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU")
    # a config is a description: a one-GPU host builds one for 16 workers (to plan, or to launch elsewhere)
    assert checks.local_workers(16) is None and TrainConfig.from_argv(["--workers", "16"]).runtime.workers == 16
    monkeypatch.setattr(checks, "gpus_here", lambda: 0)  # no GPU: every worker on the CPU
    assert checks.gpus_problem(16) is None


def test_the_rendezvous_address_and_port_must_serve_a_local_launch(monkeypatch):
    local(monkeypatch)
    assert checks.master_addr("127.0.0.1") is None and checks.master_addr("localhost") is None
    assert checks.master_addr("999.1.1.1") == "must be an IP address (such as 127.0.0.1) or localhost"
    assert "not an address of this machine" in checks.master_addr("192.0.2.1")  # TEST-NET-1: nobody's
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert checks.master_port("127.0.0.1", port) == "is in use on 127.0.0.1; choose a free port, or 0 to pick one"
        assert checks.master_port("127.0.0.1", 0) is None
        for name in checks.LAUNCH_VARIABLES:
            monkeypatch.setenv(name, "1")
        assert checks.master_port("127.0.0.1", port) is None  # the launch chose it
        assert checks.master_addr("192.0.2.1") is None and checks.master_addr("nowhere")
