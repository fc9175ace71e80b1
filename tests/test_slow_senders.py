"""Slow senders (Slowloris) against HTTP mode, through real sockets to a real server.

Found by a probe: uvicorn has no deadline for receiving a request, so 300 connections that
each sent half a request line were all still open 40 s later (and would have stayed so),
one socket each. Now the headers must come within WHISPER_HTTP_RECEIVE_TIMEOUT_S (twice
that at most) and the body within the same, each extended a second per
WHISPER_HTTP_MIN_RECEIVE_RATE bytes; a slower sender gets 408 and is disconnected, a real
upload sent slowly but above the rate is transcribed, and a WebSocket session or a kept
connection between requests is not the guard's to close. A live WebSocket client that
stops reading is cut after WHISPER_REALTIME_SEND_TIMEOUT_S (handler/faces/send_guard.py).
The deadlines here are 2 s so the test is short; the waits allow 30 s for a busy machine.
"""

from __future__ import annotations

import base64
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
import requests
import urllib3

from tests.helpers import DATA, JFK_TEXT, wer
from tests.test_http import Server

TIMEOUT_S = 2.0
CLOSE_WITHIN_S = 30.0  # generous: the deadline is 2 s (4 s for headers at most)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server(
        {
            "WHISPER_HTTP_RECEIVE_TIMEOUT_S": str(TIMEOUT_S),
            "WHISPER_HTTP_MIN_RECEIVE_RATE": "500",
            "WHISPER_MAX_CONCURRENCY": "1",
            "WHISPER_HTTP_MAX_QUEUE": "1",
            "WHISPER_REALTIME_MAX_SESSIONS": "1",
            "WHISPER_REALTIME_SEND_TIMEOUT_S": str(TIMEOUT_S),
        }
    )
    yield srv
    srv.stop()


def until_closed(
    srv: Server, first: bytes, drip: bytes = b"", piece: int = 1
) -> tuple[float, bytes]:
    """Connect, send ``first``, then ``drip`` ``piece`` bytes every 0.25 s until the server
    closes the connection; (seconds it stayed open, what the server sent)."""
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=CLOSE_WITHIN_S)
    stop = threading.Event()

    def trickle() -> None:
        for at in range(0, len(drip), piece):
            if stop.wait(0.25):
                return
            try:
                sock.sendall(drip[at : at + piece])
            except OSError:
                return

    started = time.monotonic()
    sock.sendall(first)
    dripper = threading.Thread(target=trickle, daemon=True)
    dripper.start()
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except OSError:
        pass  # a reset after the 408: the server closed with our bytes unread
    finally:
        stop.set()
        sock.close()
        dripper.join()
    return time.monotonic() - started, got


def cut(srv: Server, reason: str) -> float:
    body = requests.get(srv.url + "/metrics", timeout=30).text
    key = f'whisper_http_connections_cut_total{{reason="{reason}"}} '
    lines = [ln for ln in body.splitlines() if ln.startswith(key)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_a_connection_that_sends_nothing_or_half_a_request_gets_408(server: Server) -> None:
    before = cut(server, "slow_headers")
    took, got = until_closed(server, b"")
    assert took < CLOSE_WITHIN_S and got.startswith(b"HTTP/1.1 408"), (took, got)
    line = b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
    took, got = until_closed(server, line, drip=b"X-Padding: " + b"a" * 400)
    # 4 bytes a second buy next to nothing: closed soon after the timeout
    assert TIMEOUT_S - 0.5 < took < CLOSE_WITHIN_S and got.startswith(b"HTTP/1.1 408"), took
    # 2.4 kB a second of headers that never end: closed at the ceiling, twice the timeout
    endless = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 580) for i in range(200))
    took, got = until_closed(server, line, drip=endless, piece=600)
    assert 2 * TIMEOUT_S - 0.5 < took < CLOSE_WITHIN_S and got.startswith(b"HTTP/1.1 408"), took
    assert cut(server, "slow_headers") == before + 3
    assert requests.get(server.url + "/ping", timeout=30).status_code == 200


def test_a_body_that_trickles_is_cut_and_counted(server: Server) -> None:
    before = cut(server, "slow_body")
    head = (
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
        b"Content-Type: multipart/form-data; boundary=zz\r\n\r\n--zz\r\n"
    )
    took, got = until_closed(server, head, drip=b"a" * 400)
    assert TIMEOUT_S - 0.5 < took < CLOSE_WITHIN_S and got.startswith(b"HTTP/1.1 408"), took
    assert cut(server, "slow_body") == before + 1
    # a kept-alive connection's next request is held to the same rule
    ping = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
    took, got = until_closed(server, ping, drip=b"GET /ping HTTP/1.1\r\nX-Slow: " + b"a" * 400)
    assert got.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in got, got
    assert took < CLOSE_WITHIN_S


def test_a_slow_real_upload_keeps_extending_its_deadline(server: Server) -> None:
    """JFK's WAV (350 kB) sent in 25-kB pieces 0.3 s apart: 4 s, twice the timeout, at
    about 80 kB/s (a slow phone uplink): each piece buys 50 s, so it is transcribed."""
    body, content_type = urllib3.encode_multipart_formdata(
        {"file": ("jfk.wav", (DATA / "jfk.wav").read_bytes(), "audio/wav"), "model": "whisper-1"}
    )
    step = 25_000

    def pieces() -> Iterator[bytes]:
        for at in range(0, len(body), step):
            yield body[at : at + step]
            time.sleep(0.3)

    started = time.monotonic()
    r = requests.post(
        server.url + "/v1/audio/transcriptions",
        data=pieces(),
        headers={"Content-Type": content_type},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert time.monotonic() - started > 2 * TIMEOUT_S
    assert wer(JFK_TEXT, r.json()["text"]) <= 0.1


def test_a_quiet_websocket_session_is_not_the_guards_to_close(server: Server) -> None:
    from websockets.sync.client import connect

    url = server.url.replace("http", "ws") + "/v1/realtime?intent=transcription"
    with connect(url, open_timeout=30) as ws:
        assert '"session.created"' in str(ws.recv(timeout=30))
        time.sleep(3 * TIMEOUT_S)  # past any receive deadline
        ws.send('{"type": "input_audio_buffer.commit"}')
        assert "input_audio_buffer_commit_empty" in str(ws.recv(timeout=30))


def ws_frame(text: str) -> bytes:
    """One masked text frame, as a client sends it (RFC 6455 5.2)."""
    data, mask = text.encode(), os.urandom(4)
    size = bytes([0x80 | len(data)]) if len(data) < 126 else b"\xfe" + struct.pack(">H", len(data))
    return b"\x81" + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def test_a_live_client_that_never_reads_is_cut_and_frees_its_session(server: Server) -> None:
    """Found by a probe: a WebSocket client that sent events and read none of the answers
    held its live session for ever (151 s and counting, with 1 session allowed every other
    client got session_limit): the server's send waited for a socket that never drained,
    so neither the idle limit nor uvicorn's keepalive (its close waits for the same
    buffer) ended it. Now an event the client does not take within
    WHISPER_REALTIME_SEND_TIMEOUT_S cuts the connection."""
    from websockets.sync.client import connect

    before = cut(server, "slow_reader")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
    sock.settimeout(CLOSE_WITHIN_S)
    sock.connect(("127.0.0.1", server.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        b"GET /v1/realtime?intent=transcription HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        + f"Sec-WebSocket-Key: {key}\r\n\r\n".encode()
    )
    clear = ws_frame('{"type": "input_audio_buffer.clear"}') * 100  # 100 answers each
    sock.settimeout(5)
    try:
        for _ in range(10_000):  # until the server stops reading us (or cuts us)
            sock.sendall(clear)
    except OSError:
        pass
    url = server.url.replace("http", "ws") + "/v1/realtime?intent=transcription"
    deadline, first = time.monotonic() + CLOSE_WITHIN_S, ""
    while time.monotonic() < deadline:
        with connect(url, open_timeout=30) as ws:
            first = str(ws.recv(timeout=30))
        if '"session.created"' in first:
            break
        time.sleep(0.5)
    assert '"session.created"' in first, first  # the slot was freed
    assert cut(server, "slow_reader") == before + 1
    assert "Traceback" not in server.logs()
    sock.settimeout(CLOSE_WITHIN_S)
    try:
        while sock.recv(65536):  # what was sent before the cut, then the end
            pass
    except ConnectionResetError:
        pass  # the cut discarded what the server still held
    sock.close()


def test_bodies_received_at_once_are_bounded_by_the_queue(server: Server) -> None:
    """Every upload was received in full, at once, however many came: 2 running or
    waiting jobs here (capacity 2) and ten 3-MB bodies in flight held ten bodies' worth of
    spooled files and, once read, memory. Past the capacity a body now gets 429 (with
    Retry-After) at once; uvicorn discards what the client still sends."""
    head = (
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n"
        b"Content-Type: multipart/form-data; boundary=zz\r\n\r\n"
    )
    part = (
        b'--zz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n"
    )
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _ in range(4)]
    answers: dict[int, bytes] = {}

    def read(i: int, sock: socket.socket) -> None:
        got = b""
        try:  # a whole answer: its head and body may come in separate segments
            while chunk := sock.recv(4096):
                got += chunk
                head, end, body = got.partition(b"\r\n\r\n")
                length = [ln for ln in head.lower().split(b"\r\n") if b"content-length" in ln]
                if end and length and len(body) >= int(length[0].split(b":")[1]):
                    break
        except OSError:
            pass
        answers[i] = got

    readers = [threading.Thread(target=read, args=(i, s), daemon=True) for i, s in enumerate(socks)]
    try:
        for sock in socks:
            sock.sendall(head + part + b"a" * 100_000)
        for t in readers:
            t.start()
        deadline = time.monotonic() + CLOSE_WITHIN_S
        while len(answers) < 2 and time.monotonic() < deadline:
            for sock in socks:  # well above the minimum rate: nobody is cut for slowness
                try:
                    sock.sendall(b"a" * 2000)
                except OSError:
                    pass
            time.sleep(0.2)
        refused = [a for a in answers.values() if a.startswith(b"HTTP/1.1 429")]
        assert len(refused) == 2 and len(answers) == 2, answers
        assert all(b"retry-after" in a.lower() and b"QUEUE_FULL" in a for a in refused)
    finally:
        for sock in socks:
            sock.close()
        for t in readers:
            t.join(10)


def test_endless_headers_get_431_and_leave_memory_flat(server: Server) -> None:
    """httptools caps nothing: one connection's endless header lines grew the worker by
    200 MB in 0.4 s, and one endless header line is buffered whole by the parser. Past
    64 KiB of request line and headers: 431, the connection closed, memory flat."""
    import psutil

    worker = psutil.Process(server.proc.pid)
    before_rss, before = worker.memory_info().rss, cut(server, "headers_too_large")
    many_lines = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(1000))
    for endless in (many_lines, b"X-One: " + b"a" * 1_000_000):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=CLOSE_WITHIN_S)
        got = b""
        try:
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n")
            for at in range(0, len(endless), 16_384):
                sock.sendall(endless[at : at + 16_384])
        except OSError:
            pass  # closed by the server while we still sent
        try:
            while chunk := sock.recv(4096):
                got += chunk
        except OSError:
            pass
        finally:
            sock.close()
        assert got.startswith(b"HTTP/1.1 431"), got[:200]
    assert cut(server, "headers_too_large") == before + 2
    assert worker.memory_info().rss - before_rss < 50_000_000
    assert requests.get(server.url + "/ping", timeout=30).status_code == 200


def test_pipelined_requests_past_the_cap_cut_the_connection_and_memory_stays_flat(
    server: Server,
) -> None:
    """Found by a probe: uvicorn parses every pipelined request a read brings (up to 256
    KiB) and queues each behind the one being answered, so a client that sent 7 MB of
    `GET /v1/models` and read nothing grew the worker by 470 MB per connection (5 of them:
    2.3 GB), and the worker then ignored SIGTERM for over 60 s. Now a connection with more
    than MAX_PIPELINED requests waiting is cut; a short pipeline is still answered."""
    import psutil

    from handler.faces.receive_guard import MAX_PIPELINED

    ping = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=CLOSE_WITHIN_S) as sock:
        sock.sendall(ping * 10)
        got = b""
        while got.count(b"HTTP/1.1 200") < 10:
            got += sock.recv(65536)
    worker = psutil.Process(server.proc.pid)
    before_rss, before = worker.memory_info().rss, cut(server, "pipeline_too_long")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", server.port))
    try:
        for _ in range(1000):  # 7 MB, read by nobody
            sock.sendall(ping * 200)
    except OSError:
        pass  # cut while we still sent (or the server stopped reading)
    deadline = time.monotonic() + CLOSE_WITHIN_S
    while cut(server, "pipeline_too_long") == before and time.monotonic() < deadline:
        time.sleep(0.2)
    sock.close()
    assert cut(server, "pipeline_too_long") == before + 1
    assert MAX_PIPELINED < 200
    assert worker.memory_info().rss - before_rss < 50_000_000
    assert requests.get(server.url + "/ping", timeout=30).status_code == 200
    assert "Traceback" not in server.logs()


def test_a_reader_that_stalls_is_cut_and_a_slow_one_is_not() -> None:
    """The guard's write side, on a real uvicorn server on 127.0.0.1 with the guarded
    protocol and an app that answers 4 MB (no route of the worker answers that much without
    a long transcription): a client that reads nothing is cut once the server's writes have
    waited the timeout with less than min_rate bytes a second taken; one that reads 64 kB
    every 0.05 s (about 1 MB/s) gets every byte."""
    import asyncio

    import uvicorn

    from handler.faces.receive_guard import guarded_protocol

    body = b"a" * 4_000_000

    async def app(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": body})  # type: ignore[operator]

    cuts: list[str] = []
    protocol = guarded_protocol(TIMEOUT_S, 500, cuts.append)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=protocol, log_config=None)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + CLOSE_WITHIN_S
        while not srv.started and time.monotonic() < deadline:
            time.sleep(0.05)
        request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(request)
        while not cuts and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cuts == ["slow_reader"]
        stalled.close()
        with socket.create_connection(("127.0.0.1", port), timeout=CLOSE_WITHIN_S) as slow:
            slow.sendall(request)
            got = 0
            while chunk := slow.recv(65536):
                got += len(chunk)
                if got >= len(body):
                    break
                time.sleep(0.05)
        assert got >= len(body) and cuts == ["slow_reader"], (got, cuts)
    finally:
        srv.should_exit = True
        thread.join(30)


def test_idle_connections_past_a_low_open_files_limit_do_not_lock_clients_out() -> None:
    """Found by a probe: Docker (25 and later) starts containers with a soft open-files
    limit of 1024; the worker kept it, so about a thousand connections that send nothing
    (each held up to the receive deadline, 20 to 40 s) used every descriptor, asyncio's
    accept failed ("Too many open files", with a traceback in the log) and /ping timed out.
    Now the worker raises its soft limit to the hard one at start. Here the soft limit is
    256, the hard one left as it is, and 300 idle connections are open."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard open-files limit here is {hard}")

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    srv = Server({}, preexec=low)
    idle: list[socket.socket] = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=30))
        time.sleep(1)
        assert requests.get(srv.url + "/ping", timeout=30).status_code == 200
        assert "Too many open files" not in srv.logs()
        assert "open files: soft limit raised from 256" in srv.logs()
    finally:
        for sock in idle:
            sock.close()
        srv.stop()
