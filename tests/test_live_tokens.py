"""Short-lived tokens for browsers' live audio (handler.faces.tokens), minted and used the way
each vendor's clients do, against ``python -m handler serve`` with an API key: OpenAI's
client secrets through the ``openai`` SDK, Deepgram's grant through ``deepgram-sdk`` (its
live client then connects with the token alone), AssemblyAI's ``/v3/token`` as its browser
code fetches it. A token opens a live WebSocket until it expires, and nothing else."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import requests
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from handler.faces import tokens
from tests.helpers import DATA
from tests.test_http import Server

KEY = "live-token-test-key-0123456789abcdef"


def test_a_token_is_checked_by_its_key_and_its_expiry() -> None:
    token, expires = tokens.mint(KEY, 60, now=1000.0)
    assert expires == 1060 and token.startswith("wt_")
    assert tokens.valid(KEY, token, now=1059.0) and tokens.valid(KEY, token.encode(), now=1000)
    assert not tokens.valid(KEY, token, now=1060.0)  # expired
    assert not tokens.valid("another-key-0123456789abcdef", token, now=1000.0)
    stamp, mac = token[3:].split(".")
    assert not tokens.valid(KEY, f"wt_{int(stamp) + 3600}.{mac}", now=1000.0)  # extended
    assert not tokens.valid(KEY, KEY, now=1000.0) and not tokens.valid(KEY, "wt_x.y")
    assert tokens.mint(KEY, 10**9, now=0)[1] == tokens.MAX_TTL_S


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server({"WHISPER_API_KEY": KEY, "WHISPER_REALTIME_MAX_SESSIONS": "2"})
    yield srv
    srv.stop()


def _ws(srv: Server, path: str, **kwargs: object) -> object:
    return connect(srv.url.replace("http", "ws") + path, open_timeout=30, **kwargs)


@pytest.mark.e2e
def test_openais_client_secret_opens_the_realtime_socket_and_nothing_else(server: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    secret = client.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 60},
        session={"type": "transcription"},
    )
    assert secret.value.startswith("wt_") and secret.expires_at > time.time() + 50
    offered = ["realtime", f"openai-insecure-api-key.{secret.value}"]  # as a browser offers
    with _ws(server, "/v1/realtime?intent=transcription", subprotocols=offered) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
    beta = client.beta.realtime.transcription_sessions.create(input_audio_format="pcm16")
    assert beta.client_secret.value.startswith("wt_") and beta.input_audio_format == "pcm16"
    offered = ["realtime", f"openai-insecure-api-key.{beta.client_secret.value}"]
    with _ws(server, "/v1/realtime?intent=transcription", subprotocols=offered) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
    # The token is no key: the file routes, the job API and minting refuse it.
    bearer = {"Authorization": f"Bearer {secret.value}"}
    with open(DATA / "jfk.wav", "rb") as f:
        upload = requests.post(
            f"{server.url}/v1/audio/transcriptions",
            files={"file": f},
            data={"model": "whisper-1"},
            headers=bearer,
            timeout=30,
        )
    assert upload.status_code == 401
    assert requests.post(f"{server.url}/v2/x/run", json={}, headers=bearer).status_code == 401
    again = requests.post(f"{server.url}/v1/realtime/client_secrets", json={}, headers=bearer)
    assert again.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=server.url + "/v1", api_key="wrong", max_retries=0
        ).realtime.client_secrets.create()
    bad = requests.post(
        f"{server.url}/v1/realtime/client_secrets",
        json={"expires_after": {"seconds": 99999}},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert bad.status_code == 400 and "expires_after" in bad.json()["error"]["message"]


@pytest.mark.e2e
def test_deepgrams_grant_lets_its_live_client_connect_with_the_token_alone(server: Server) -> None:
    from deepgram import DeepgramClient
    from deepgram.environment import DeepgramClientEnvironment

    ws_url = server.url.replace("http", "ws")
    env = DeepgramClientEnvironment(base=server.url, production=ws_url, agent="", agent_rest="")
    grant = DeepgramClient(api_key=KEY, environment=env).auth.v1.tokens.grant(ttl_seconds=60)
    assert grant.access_token.startswith("wt_") and grant.expires_in == 60
    browser = DeepgramClient(access_token=grant.access_token, environment=env)
    with browser.listen.v1.connect(model="nova-3", encoding="linear16", sample_rate=16000) as conn:
        conn.send_close_stream()
        kinds = [m.type for m in conn]
    assert kinds[-1] == "Metadata", kinds
    # A browser offers the token as subprotocols; the server answers "bearer".
    offered = ["bearer", grant.access_token]
    with _ws(server, "/v1/listen?encoding=linear16&sample_rate=16000", subprotocols=offered) as ws:
        assert ws.subprotocol == "bearer"
        ws.send(json.dumps({"type": "CloseStream"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "Metadata"


@pytest.mark.e2e
def test_assemblyais_token_in_the_query_opens_its_stream_until_it_expires(server: Server) -> None:
    got = requests.get(
        f"{server.url}/v3/token?expires_in_seconds=60", headers={"Authorization": KEY}, timeout=30
    )
    assert got.status_code == 200, got.text
    token = got.json()["token"]
    with _ws(server, f"/v3/ws?sample_rate=16000&token={token}") as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "Begin"
        ws.send(json.dumps({"type": "Terminate"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "Termination"
    expired, _ = tokens.mint(KEY, 60, now=time.time() - 120)
    forged, _ = tokens.mint("someone-elses-key-0123456789", 60)
    for refused in (expired, forged, "wt_1.0"):
        with pytest.raises(InvalidStatus) as no:
            _ws(server, f"/v3/ws?sample_rate=16000&token={refused}")
        assert no.value.response.status_code == 401
    assert requests.get(f"{server.url}/v3/token?expires_in_seconds=60").status_code == 401
    too_long = requests.get(
        f"{server.url}/v3/token?expires_in_seconds=601", headers={"Authorization": KEY}
    )
    assert too_long.status_code == 400 and "expires_in_seconds" in too_long.json()["error"]
    assert token not in server.logs() and KEY not in server.logs()
