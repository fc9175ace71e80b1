"""The short HTTP soak: the real ``python -m handler serve`` on 127.0.0.1 under
a seeded mix from four clients: good uploads, streams and jobs, every bad-input class,
disconnects mid-upload, mid-transcription and mid-stream, a burst past admission. Every
answer right, none lost, every slot free afterwards and full concurrency served, the
server alive. ``python -m bench http-soak`` is the 1000-request version."""

from __future__ import annotations

import pytest

from bench.soak.http_soak import failed, run

pytestmark = [pytest.mark.e2e, pytest.mark.model]


def test_short_http_soak_answers_every_request_rightly() -> None:
    result = run(requests_n=70, clients=4, seed=1)
    assert not failed(result, rss_limit=0.5), result  # few samples: RSS is the bench's
    outcomes = result["outcomes"]
    assert outcomes.get("200", 0) >= 10 and outcomes.get("gone", 0) >= 1, outcomes
    assert {"400", "413", "415"} <= set(outcomes), outcomes  # a real mix of refusals
    assert outcomes.get("429", 0) >= 1, outcomes  # the burst met the admission limit
