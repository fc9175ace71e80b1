"""``python -m bench redact``'s counting (bench/accuracy/redact.py), on texts of its own."""

from __future__ import annotations


def test_the_bench_counts_what_it_hides_and_what_it_leaves() -> None:
    from types import SimpleNamespace

    from bench.accuracy.redact import references

    items = [
        SimpleNamespace(language="en", text="Press 7 for 1234 and 5."),
        SimpleNamespace(language="en", text="No numbers here."),
    ]
    assert references(items)["en"] == {
        "texts": 2,
        "words": 9,
        "changed": 1,
        "masked": ["1234", "5."],
        "runs_left": 0,
        "digits_left": 1,  # "7": a short number inside a segment stays, by design
    }
