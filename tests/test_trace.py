import json

from scalesgd.trace import Tracer, chrome_trace, write_chrome_trace


def test_spans_become_complete_events_with_one_row_per_rank_and_thread(tmp_path):
    tracers = [Tracer(True), Tracer(True)]
    for rank, tracer in enumerate(tracers):
        with tracer.span("forward"):
            pass
        tracer.add("communicate", 10.0 + rank, 30.0, "comm", bucket=0)
    write_chrome_trace(tmp_path / "t.json", [t.events for t in tracers])
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {(e["pid"], e["name"]) for e in spans} == {(0, "forward"), (0, "communicate"), (1, "forward"),
                                                       (1, "communicate")}
    assert min(e["ts"] for e in spans) == 0.0 and all(e["dur"] >= 0 for e in spans)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(names.values()) == ["comm", "comm", "main", "main"]
    comm = next(e for e in spans if e["name"] == "communicate" and e["pid"] == 1)
    assert comm["args"] == {"bucket": 0} and comm["dur"] == 19.0


def test_a_disabled_tracer_records_nothing():
    tracer = Tracer(False)
    with tracer.span("forward"):
        pass
    tracer.add("x", 0, 1)
    assert tracer.events == [] and chrome_trace([[]])["traceEvents"][0]["ph"] == "M"
