"""Audio sources against real servers: base64, the SSRF guard, limits and faults, S3 via moto.

Every HTTP test talks to a real ThreadingHTTPServer on 127.0.0.1. Blocked addresses are
proved unconnected with a Python audit hook on ``socket.connect`` (nothing is mocked):
no test ever opens a connection to a non-loopback address.
"""

from __future__ import annotations

import base64
import gzip
import logging
import pathlib
import socket
import ssl
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from handler.audio.sources import (
    blocked_reason,
    decode_base64,
    fetch_s3,
    fetch_to_file,
    fetch_url,
    redact_url,
)
from handler.errors import Code, WorkerError
from handler.settings import Settings, load_settings
from tests.httpserver import LocalServer, respond

DATA = pathlib.Path(__file__).parent / "data"
JFK = (DATA / "jfk.wav").read_bytes()
SECRET = "X-Amz-Signature=s3cr3tSIG&token=t0ps3cret"

# --------------------------------------------------------------------------- helpers

_events: list[tuple[str, tuple]] | None = None


def _audit(event: str, args: tuple) -> None:
    if _events is not None and event in ("socket.connect", "socket.getaddrinfo"):
        _events.append((event, args[1] if event == "socket.connect" else args[:2]))


sys.addaudithook(_audit)


@pytest.fixture
def net_events():
    """Records every socket.connect address and getaddrinfo (host, port) during the test."""
    global _events
    _events = []
    yield _events
    _events = None


def connects(events) -> list:
    return [a for e, a in events if e == "socket.connect"]


def settings(**kw: object) -> Settings:
    env = {"WHISPER_ALLOW_PRIVATE_URLS": "true", "WHISPER_DOWNLOAD_TIMEOUT_S": "10"}
    env.update({f"WHISPER_{k.upper()}": str(v) for k, v in kw.items()})
    return load_settings(env)


def fails(code: Code, fn, *args, **kw) -> WorkerError:
    with pytest.raises(WorkerError) as info:
        fn(*args, **kw)
    assert info.value.code is code, info.value.message
    return info.value


def _drip(h, stop: threading.Event, interval: float = 0.2) -> None:
    h.send_response(200)
    h.send_header("Content-Length", "100")
    h.end_headers()
    for _ in range(100):
        h.wfile.write(b"x")
        h.wfile.flush()
        if stop.wait(interval):
            return


def _endless_chunked(h, stop: threading.Event) -> None:
    h.send_response(200)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    block = b"%x\r\n%s\r\n" % (65536, b"\0" * 65536)
    for _ in range(3200):  # bounded: 200 MiB at most, then the handler gives up
        if stop.is_set():
            return
        h.wfile.write(block)


GZ = gzip.compress(b"\0" * (8 << 20), 9)  # 8 MiB of zeros in about 8 KB


@pytest.fixture
def srv():
    s = LocalServer().start()
    stop = s.stop_event
    flaky = {"n": 0}

    def flaky_handler(h):
        flaky["n"] += 1
        respond(h, 503 if flaky["n"] <= 2 else 200, b"busy" if flaky["n"] <= 2 else JFK)

    def redirect(h):
        target = parse_qs(urlsplit(h.path).query)["to"][0]
        respond(h, 302, headers={"Location": target})

    def chain(h):
        i = int(urlsplit(h.path).path.rsplit("/", 1)[1])
        respond(h, 302, headers={"Location": f"/chain/{i + 1}"})

    def truncated(h):
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        h.wfile.write(b"a" * 500)

    def truncated_chunked(h):
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.write(b"400\r\n" + b"a" * 100)

    def chunked_ok(h):
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for i in range(0, len(JFK), 10000):
            part = JFK[i : i + 10000]
            h.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        h.wfile.write(b"0\r\n\r\n")

    def close_delimited(h):
        h.send_response(200)
        h.end_headers()
        h.wfile.write(JFK)

    def huge_length(h):
        h.send_response(200)
        h.send_header("Content-Length", str(10**12))
        h.end_headers()
        h.wfile.write(b"\0" * 1024)
        stop.wait(5)

    def hang(h):
        stop.wait(10)

    s.route("/ok", lambda h: respond(h, 200, JFK, {"Content-Type": "audio/wav"}))
    s.route("/status/*", lambda h: respond(h, int(h.path.split("/")[2].split("?")[0]), b"no"))
    s.route("/flaky", flaky_handler)
    s.route("/always503", lambda h: respond(h, 503, b"down"))
    s.route("/redirect", redirect)
    s.route("/loop", lambda h: respond(h, 302, headers={"Location": "/loop"}))
    s.route("/chain/*", chain)
    s.route("/truncated", truncated)
    s.route("/truncated-chunked", truncated_chunked)
    s.route("/chunked", chunked_ok)
    s.route("/close-delimited", close_delimited)
    s.route("/drip", lambda h: _drip(h, stop))
    s.route("/hang", hang)
    s.route("/endless", lambda h: _endless_chunked(h, stop))
    s.route("/huge-length", huge_length)
    s.route("/gzip", lambda h: respond(h, 200, GZ, {"Content-Encoding": "gzip"}))
    yield s
    s.stop()


@pytest.fixture
def dest(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "audio.bin"


# --------------------------------------------------------------------------- base64


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _wrap(text: str, width: int, sep: str = "\n") -> str:
    return sep.join(text[i : i + width] for i in range(0, len(text), width))


@pytest.mark.parametrize(
    "variant",
    [
        "raw",
        "data_uri",
        "data_uri_upper",
        "mime_lines",
        "crlf_lines_and_padding_space",
        "url_safe_no_padding",
        "no_padding",
        "data_uri_wrapped_at_76",
    ],
)
def test_base64_variants_accepted(variant: str) -> None:
    raw = _b64(JFK)
    text = {
        "raw": raw,
        "data_uri": "data:audio/wav;base64," + raw,
        "data_uri_upper": "DATA:audio/x-wav;BASE64," + raw,
        "mime_lines": _wrap(raw, 76),
        "crlf_lines_and_padding_space": "  \r\n"
        + "\r\n".join(raw[i : i + 64] for i in range(0, len(raw), 64))
        + "\r\n ",
        "url_safe_no_padding": base64.urlsafe_b64encode(JFK + b"x").decode().rstrip("="),
        "no_padding": raw.rstrip("="),
        "data_uri_wrapped_at_76": _wrap("data:audio/wav;base64," + raw, 76),
    }[variant]
    expected = JFK + b"x" if variant == "url_safe_no_padding" else JFK
    assert raw.endswith("==") and len(JFK + b"x") % 3 == 2  # so both variants really drop "="
    assert decode_base64(text, 10**7) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n ",
        "not base64 at all!",
        "hello world",
        "This is plain text, not audio.",
        "UklGR$$$",
        "UklG=RiQ=",  # padding in the middle
        "UklGR",  # length 5 -> one dangling character
        "UklGRiQ\u00e9",
        "data:audio/wav,UklGRiQ=",  # data: URI that is not base64
        "data:audio/wav;base64",  # no comma
        "data:audio/wav;base64,%%%%",
    ],
)
def test_base64_garbage_refused(text: str) -> None:
    err = fails(Code.INVALID_BASE64, decode_base64, text, 10**6)
    assert err.retryable is False
    if len(text) > 6:
        assert text not in err.message


def test_base64_whitespace_must_look_like_line_wrapping() -> None:
    raw = _b64(JFK[:300])
    fails(Code.INVALID_BASE64, decode_base64, raw[:10] + " " + raw[10:], 10**6)
    uneven = " ".join([raw[:40], raw[40:60], raw[60:100], raw[100:]])  # inner lines 20 and 40
    fails(Code.INVALID_BASE64, decode_base64, uneven, 10**6)
    wrapped = "\n".join(raw[i : i + 40] for i in range(0, len(raw), 40))
    assert decode_base64(wrapped, 10**6) == JFK[:300]


def test_base64_over_cap_is_input_too_large_before_decoding() -> None:
    raw = _b64(JFK)
    assert decode_base64(raw, len(JFK)) == JFK  # exactly at the cap
    err = fails(Code.INPUT_TOO_LARGE, decode_base64, raw, len(JFK) - 1)
    assert "audio_url" in err.message and "s3://" in err.message
    # A 40 MB string of junk is refused by its length, not reported as bad base64.
    started = time.monotonic()
    fails(Code.INPUT_TOO_LARGE, decode_base64, "!" * 40_000_000, 1_000_000)
    assert time.monotonic() - started < 1.0


# --------------------------------------------------------------------------- redaction


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://user:pw@Example.com:8443/a/b.wav?sig=1#frag", "https://example.com:8443/a/b.wav"),
        ("http://[::1]:80/x?y", "http://[::1]:80/x"),
        ("s3://bucket/key/a.wav?versionId=3", "s3://bucket/key/a.wav"),
        ("data:audio/wav;base64,UklGRiQAAABXQVZF", "data:"),
        ("http://h:notaport/x", "<invalid URL>"),
        ("http://h/a\r\nInjected: 1", "http://h/aInjected: 1"),  # urlsplit drops CR/LF
        ("http://h/a\x00\x1bb", "http://h/a??b"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


# --------------------------------------------------------------------------- address policy


@pytest.mark.parametrize(
    ("ip", "strict", "private_ok"),
    [
        ("8.8.8.8", None, None),
        ("2606:4700:4700::1111", None, None),
        ("127.0.0.1", "loopback", None),
        ("::1", "loopback", None),
        ("10.1.2.3", "private", None),
        ("172.16.0.1", "private", None),
        ("192.168.1.1", "private", None),
        ("100.64.0.1", "private", None),
        ("fd12:3456::1", "private", None),
        ("169.254.169.254", "link-local (cloud metadata)", "link-local (cloud metadata)"),
        ("::ffff:169.254.169.254", "link-local (cloud metadata)", "link-local (cloud metadata)"),
        ("64:ff9b::a9fe:a9fe", "link-local (cloud metadata)", "link-local (cloud metadata)"),
        ("64:ff9b::808:808", None, None),
        ("64:ff9b::a00:1", "private", None),
        # 6to4, Teredo and IPv4-compatible forms carry an IPv4 host too.
        ("2002:a9fe:a9fe::1", "link-local (cloud metadata)", "link-local (cloud metadata)"),
        ("2002:a00:1::", "private", None),
        ("2002:7f00:1::", "loopback", None),
        ("::10.0.0.1", "reserved", "reserved"),
        ("fe80::1", "link-local (cloud metadata)", "link-local (cloud metadata)"),
        ("fd00:ec2::254", "reserved", "reserved"),
        ("224.0.0.1", "multicast", "multicast"),
        ("ff02::1", "multicast", "multicast"),
        ("0.0.0.0", "reserved", "reserved"),
        ("::", "reserved", "reserved"),
        ("240.0.0.1", "reserved", "reserved"),
        ("255.255.255.255", "reserved", "reserved"),
    ],
)
def test_blocked_reason(ip: str, strict: str | None, private_ok: str | None) -> None:
    assert blocked_reason(ip) == strict
    assert blocked_reason(ip, allow_private=True) == private_ok


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "2130706433", "0x7f.1", "127.1", "[::ffff:127.0.0.1]"]
)
def test_loopback_forms_refused_without_connecting(srv, net_events, dest, host) -> None:
    err = fails(
        Code.URL_NOT_ALLOWED, fetch_url, srv.url("/ok", host), dest, settings(allow_private_urls=0)
    )
    assert err.retryable is False
    assert connects(net_events) == [] and srv.connections == 0 and not dest.exists()


ALWAYS_BLOCKED_HOSTS = [
    "169.254.169.254",
    "[::ffff:169.254.169.254]",
    "[::ffff:a9fe:a9fe]",
    "[64:ff9b::a9fe:a9fe]",
    "[2002:a9fe:a9fe::1]",
    "[fd00:ec2::254]",
    "224.0.0.1",
    "[ff02::1]",
    "0.0.0.0",
    "[::]",
    "[fe80::1]",
    "[fe80::1%25nosuchif0]",
    "0xa9fea9fe",  # 169.254.169.254 in hex, resolved by getaddrinfo
]
PRIVATE_HOSTS = ["100.64.0.1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "[fd12::1]"]


@pytest.mark.parametrize(
    ("host", "allow_private"),
    [(h, False) for h in ALWAYS_BLOCKED_HOSTS + PRIVATE_HOSTS]
    + [(h, True) for h in ALWAYS_BLOCKED_HOSTS],  # private ones would really be dialled
)
def test_blocked_addresses_refused_before_any_connection(net_events, dest, host, allow_private):
    s = settings(allow_private_urls=int(allow_private), connect_timeout_s=1)
    fails(Code.URL_NOT_ALLOWED, fetch_url, f"http://{host}/latest/meta-data/", dest, s)
    assert connects(net_events) == []


def test_fetch_ok_pins_the_checked_address(srv, net_events, dest) -> None:
    url = srv.url("/ok", "localhost")
    assert fetch_url(url, dest, settings()) == len(JFK)
    assert dest.read_bytes() == JFK
    lookups = [a for e, a in net_events if e == "socket.getaddrinfo" and a[0] == "localhost"]
    assert len(lookups) == 1  # resolved once: the connect used that answer, no rebinding window
    assert all(addr[0] in ("127.0.0.1", "::1") for addr in connects(net_events))
    (headers,) = srv.headers_for("/ok")
    assert headers["Host"] == f"localhost:{srv.port}"
    assert headers["Accept-Encoding"] == "identity"


@pytest.mark.parametrize("path", ["/chunked", "/close-delimited"])
def test_fetch_other_framings(srv, dest, path) -> None:
    assert fetch_url(srv.url(path), dest, settings()) == len(JFK)
    assert dest.read_bytes() == JFK


# --------------------------------------------------------------------------- redirects


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/latest/",
        "http://[fd00:ec2::254]/latest/",
        "http://0xa9fea9fe/",
    ],
)
def test_redirect_to_metadata_refused_without_connecting(srv, net_events, dest, target) -> None:
    url = srv.url("/redirect?to=" + target)
    fails(Code.URL_NOT_ALLOWED, fetch_url, url, dest, settings())
    assert srv.hits["/redirect"] == 1
    assert all(addr[0] == "127.0.0.1" for addr in connects(net_events))
    assert not dest.exists()


def test_redirect_to_other_scheme_refused(srv, dest) -> None:
    url = srv.url("/redirect?to=file:///etc/passwd")
    fails(Code.URL_NOT_ALLOWED, fetch_url, url, dest, settings())
    assert srv.hits["/redirect"] == 1


def test_redirect_followed(srv, dest) -> None:
    assert fetch_url(srv.url("/redirect?to=/ok"), dest, settings()) == len(JFK)
    assert srv.hits["/redirect"] == 1 and srv.hits["/ok"] == 1


def test_redirect_loop_refused(srv, dest) -> None:
    err = fails(Code.URL_NOT_ALLOWED, fetch_url, srv.url("/loop"), dest, settings())
    assert "redirect" in err.message and srv.hits["/loop"] == 1


def test_redirect_chain_limit(srv, dest) -> None:
    err = fails(
        Code.URL_NOT_ALLOWED, fetch_url, srv.url("/chain/0"), dest, settings(max_redirects=3)
    )
    assert "more than 3 redirects" in err.message
    assert sum(n for p, n in srv.hits.items() if p.startswith("/chain/")) == 4
    assert not dest.exists()


# --------------------------------------------------------------------------- status codes


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410])
def test_4xx_not_retried(srv, dest, status) -> None:
    err = fails(Code.SOURCE_HTTP_4XX, fetch_url, srv.url(f"/status/{status}"), dest, settings())
    assert err.retryable is False and str(status) in err.message
    assert srv.hits[f"/status/{status}"] == 1 and not dest.exists()


def test_429_is_retryable_but_not_retried_here(srv, dest) -> None:
    err = fails(Code.SOURCE_HTTP_4XX, fetch_url, srv.url("/status/429"), dest, settings())
    assert err.retryable is True and srv.hits["/status/429"] == 1


def test_5xx_then_success(srv, dest) -> None:
    assert fetch_url(srv.url("/flaky"), dest, settings()) == len(JFK)
    assert srv.hits["/flaky"] == 3 and dest.read_bytes() == JFK


def test_5xx_forever(srv, dest) -> None:
    started = time.monotonic()
    err = fails(Code.SOURCE_HTTP_5XX, fetch_url, srv.url("/always503"), dest, settings())
    assert err.retryable is True and srv.hits["/always503"] == 3
    assert time.monotonic() - started < 3 and not dest.exists()


def test_5xx_retries_stop_at_the_deadline(srv, dest) -> None:
    fails(
        Code.SOURCE_HTTP_5XX,
        fetch_url,
        srv.url("/always503"),
        dest,
        settings(download_timeout_s=0.2),
    )
    assert srv.hits["/always503"] == 1


# --------------------------------------------------------------------------- body faults


@pytest.mark.parametrize("path", ["/truncated", "/truncated-chunked"])
def test_truncated_body(srv, dest, path) -> None:
    fails(Code.SOURCE_TRUNCATED, fetch_url, srv.url(path), dest, settings())
    assert not dest.exists()


@pytest.mark.parametrize("path", ["/drip", "/hang"])
def test_total_deadline(srv, dest, path) -> None:
    started = time.monotonic()
    err = fails(
        Code.SOURCE_TIMEOUT, fetch_url, srv.url(path), dest, settings(download_timeout_s=1.5)
    )
    elapsed = time.monotonic() - started
    assert 1.4 < elapsed < 3.0, elapsed
    assert err.retryable is True and not dest.exists()


def test_cancel_mid_drip(srv, dest) -> None:
    cancel = threading.Event()
    threading.Timer(0.6, cancel.set).start()
    started = time.monotonic()
    fails(
        Code.CANCELLED,
        fetch_url,
        srv.url("/drip"),
        dest,
        settings(download_timeout_s=30),
        cancel=cancel,
    )
    assert time.monotonic() - started < 1.5 and not dest.exists()


def test_endless_body_too_large(srv, dest) -> None:
    cap = 1 << 20
    err = fails(
        Code.SOURCE_TOO_LARGE,
        fetch_url,
        srv.url("/endless"),
        dest,
        settings(max_download_bytes=cap),
    )
    assert str(cap) in err.message and not dest.exists()


def test_declared_length_over_cap_refused_up_front(srv, dest) -> None:
    started = time.monotonic()
    fails(Code.SOURCE_TOO_LARGE, fetch_url, srv.url("/huge-length"), dest, settings())
    assert time.monotonic() - started < 1.0 and not dest.exists()


def test_exactly_at_cap_ok_one_over_refused(srv, dest) -> None:
    assert fetch_url(srv.url("/ok"), dest, settings(max_download_bytes=len(JFK))) == len(JFK)
    s = settings(max_download_bytes=len(JFK) - 1)
    fails(Code.SOURCE_TOO_LARGE, fetch_url, srv.url("/chunked"), dest, s)
    assert not dest.exists()


def test_gzip_not_expanded(srv, dest) -> None:
    cap = 1 << 20  # the bomb expands to 8 MiB; its raw bytes are about 8 KB
    assert fetch_url(srv.url("/gzip"), dest, settings(max_download_bytes=cap)) == len(GZ)
    assert dest.read_bytes() == GZ


def test_connection_refused_unreachable(dest) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = fails(Code.SOURCE_UNREACHABLE, fetch_url, f"http://127.0.0.1:{port}/a", dest, settings())
    assert err.retryable is True and not dest.exists()


def test_dns_failure_unreachable(dest) -> None:
    s = settings(connect_timeout_s=3)
    fails(Code.SOURCE_UNREACHABLE, fetch_url, "http://no-such-host.invalid/a.wav", dest, s)


# --------------------------------------------------------------------------- secrets


def test_credentials_and_query_never_in_errors_or_logs(srv, dest, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    base = f"http://alice:hunter2@127.0.0.1:{srv.port}"
    e404 = fails(Code.SOURCE_HTTP_4XX, fetch_url, f"{base}/status/404?{SECRET}", dest, settings())
    eblk = fails(
        Code.URL_NOT_ALLOWED, fetch_url, f"{base}/ok?{SECRET}", dest, settings(allow_private_urls=0)
    )
    fetch_url(f"{base}/ok?{SECRET}", dest, settings())
    (headers,) = srv.headers_for("/ok")
    assert headers["Authorization"] == "Basic " + _b64(b"alice:hunter2")
    for text in (e404.message, eblk.message, caplog.text):
        for secret in ("s3cr3tSIG", "t0ps3cret", "hunter2", "alice", "Signature"):
            assert secret not in text
    assert f"127.0.0.1:{srv.port}/status/404" in e404.message


# --------------------------------------------------------------------------- schemes


@pytest.mark.parametrize(
    "source",
    [
        "file:///etc/passwd",
        "gopher://127.0.0.1:70/_GET",
        "ftp://example.com/a.wav",
        "data:audio/wav;base64,UklGRiQAAABXQVZFZm10",
        "javascript:alert(1)",
        "/etc/passwd",
        "dict://127.0.0.1:11211/stat",
    ],
)
def test_other_schemes_refused(net_events, dest, source) -> None:
    err = fails(Code.URL_NOT_ALLOWED, fetch_to_file, source, dest, settings())
    assert "UklGRiQ" not in err.message and connects(net_events) == []


def test_fetch_to_file_dispatches_http(srv, dest) -> None:
    assert fetch_to_file(srv.url("/ok"), dest, settings()) == len(JFK)


# --------------------------------------------------------------------------- s3


@pytest.fixture(scope="module")
def moto_server():
    """A real moto S3 server on 127.0.0.1: the worker fetches over HTTP as from AWS."""
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(monkeypatch, moto_server):
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import boto3

    client = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_server)
    for bucket in ("audio-in", "other"):
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
    client.put_object(Bucket="audio-in", Key="clips/jfk.wav", Body=JFK)
    client.put_object(Bucket="other", Key="jfk.wav", Body=JFK)
    yield client


def s3_settings(endpoint: str, **kw: object) -> Settings:
    # Private URLs off: the operator's own endpoint is trusted, nothing else on 127.0.0.1.
    return settings(s3_endpoint_url=endpoint, allow_private_urls="false", **kw)


def test_s3_allowed_bucket(s3, moto_server, dest) -> None:
    s = s3_settings(moto_server, s3_allowed_buckets="audio-in")
    assert fetch_to_file("s3://audio-in/clips/jfk.wav", dest, s) == len(JFK)
    assert dest.read_bytes() == JFK


def test_s3_bucket_not_allowed(s3, moto_server, dest) -> None:
    for allowed in ("audio-in", ""):
        s = s3_settings(moto_server, s3_allowed_buckets=allowed)
        fails(Code.URL_NOT_ALLOWED, fetch_s3, "s3://other/jfk.wav", dest, s)
    assert not dest.exists()


def test_s3_errors_name_the_bucket_as_sent(s3, moto_server, dest) -> None:
    """``s3://Allowed-Bucket/`` was reported as ``s3://allowed-bucket/...``,
    which is on the allowlist: the message named another bucket than the one checked."""
    s = s3_settings(moto_server, s3_allowed_buckets="allowed-bucket")
    err = fails(Code.URL_NOT_ALLOWED, fetch_s3, "s3://Allowed-Bucket/A.wav?x=1", dest, s)
    assert "s3://Allowed-Bucket/A.wav" in err.message and "allowed-bucket" not in err.message


def test_s3_missing_key_and_bucket(s3, moto_server, dest) -> None:
    s = s3_settings(moto_server, s3_allowed_buckets="audio-in,gone")
    err = fails(Code.SOURCE_HTTP_4XX, fetch_s3, "s3://audio-in/nope.wav", dest, s)
    assert err.retryable is False and "s3://audio-in/nope.wav" in err.message
    assert "X-Amz" not in err.message and "Signature" not in err.message
    fails(Code.SOURCE_HTTP_4XX, fetch_s3, "s3://gone/a.wav", dest, s)
    assert not dest.exists()


def test_s3_over_cap(s3, moto_server, dest) -> None:
    s = s3_settings(moto_server, s3_allowed_buckets="audio-in", max_download_bytes=len(JFK) - 1)
    fails(Code.SOURCE_TOO_LARGE, fetch_s3, "s3://audio-in/clips/jfk.wav", dest, s)
    assert not dest.exists()


def test_s3_malformed(s3, moto_server, dest) -> None:
    s = s3_settings(moto_server, s3_allowed_buckets="audio-in")
    for url in ("s3://audio-in", "s3://audio-in/", "s3:///key"):
        fails(Code.INVALID_INPUT, fetch_s3, url, dest, s)


@pytest.mark.parametrize("behaviour", ["drip", "hang"])
def test_s3_download_deadline_holds(srv, dest, monkeypatch, behaviour) -> None:
    """Against WHISPER_DOWNLOAD_TIMEOUT_S=5 a dripping S3 endpoint took 64.6 s
    and a hanging one 20.3 s (boto3's timeouts are per read, and it retried). Here a real
    server on 127.0.0.1 plays the S3 endpoint; the deadline (2 s) holds to within a second."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    def drip(h) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100000")
        h.end_headers()
        while not srv.stop_event.wait(0.2):
            h.wfile.write(b"x")
            h.wfile.flush()

    def hang(h) -> None:
        srv.stop_event.wait(30)

    srv.route("/bucket/*", drip if behaviour == "drip" else hang)
    s = s3_settings(srv.url("").rstrip("/"), s3_allowed_buckets="bucket", download_timeout_s=2)
    started = time.monotonic()
    err = fails(Code.SOURCE_TIMEOUT, fetch_s3, "s3://bucket/slow.wav", dest, s)
    took = time.monotonic() - started
    assert took < 3.5, f"{behaviour}: the 2 s deadline took {took:.1f} s"
    assert "s3://bucket/slow.wav" in err.message and not dest.exists()
    assert srv.hits["/bucket/slow.wav"] == 1  # no retry past the deadline


# --------------------------------------------------------------------------- https


@pytest.fixture
def tls_srv(tmp_path, monkeypatch):
    """An HTTPS LocalServer whose certificate (from a throwaway CA) names only 'localhost'."""
    x509 = pytest.importorskip("cryptography.x509")
    import datetime

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(cn: str):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("test CA"))
        .issuer_name(name("test CA"))
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp_path / "leaf.pem").write_bytes(
        leaf.public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "leaf.pem")
    s = LocalServer(tls=ctx).start()
    s.route("/ok", lambda h: respond(h, 200, JFK))
    yield s
    s.stop()


def test_https_pinned_with_sni_and_verification(tls_srv, net_events, dest) -> None:
    assert fetch_url(tls_srv.url("/ok", "localhost"), dest, settings()) == len(JFK)
    assert dest.read_bytes() == JFK
    assert tls_srv.headers_for("/ok")[0]["Host"] == f"localhost:{tls_srv.port}"
    assert all(addr[0] in ("127.0.0.1", "::1") for addr in connects(net_events))


def test_https_certificate_for_another_name_refused(tls_srv, dest) -> None:
    # Same server, same certificate, but the URL names 127.0.0.1, which the cert does not.
    err = fails(Code.SOURCE_UNREACHABLE, fetch_url, tls_srv.url("/ok"), dest, settings())
    assert "certificate" in err.message and not dest.exists()
    assert tls_srv.hits["/ok"] == 0


def test_cancel_already_set_connects_nowhere(srv, net_events, dest) -> None:
    cancel = threading.Event()
    cancel.set()
    fails(Code.CANCELLED, fetch_url, srv.url("/ok"), dest, settings(), cancel=cancel)
    assert connects(net_events) == [] and srv.connections == 0 and not dest.exists()


def test_no_credentials_never_dials_the_metadata_service(net_events, dest, monkeypatch) -> None:
    """boto3's credential chain falls back to 169.254.169.254; the worker turns that off."""
    for key in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_EC2_METADATA_DISABLED",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(dest.parent / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(dest.parent / "none"))
    s = settings(s3_allowed_buckets="b", s3_endpoint_url="http://127.0.0.1:9")
    from handler.audio.sources import fetch_s3

    with pytest.raises(WorkerError) as info:
        fetch_s3("s3://b/key.wav", dest, s)
    assert info.value.code is Code.INTERNAL and info.value.retryable is False
    assert not [a for a in connects(net_events) if "169.254" in str(a)], connects(net_events)
    assert all(e[1][0] != "169.254.169.254" for e in net_events if e[0] == "socket.getaddrinfo")
