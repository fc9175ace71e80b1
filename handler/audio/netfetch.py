"""Fetch one untrusted http(s) URL into a local file: SSRF-safe, with a total deadline and a cap.

Why our own small HTTP client (``http.client`` on a socket we open ourselves) instead of
``requests`` or ``runpod.serverless.utils.rp_ssrf.safe_get``: we must (1) dial exactly the
address we checked (no second DNS lookup that could rebind), (2) enforce one *total*
deadline from DNS to the last byte even against a server that drips one byte a second, and
(3) abort promptly on cancel. Per-socket-operation timeouts (all ``requests`` offers) reset
on every byte, and rp_ssrf has no total deadline, quotes whole URLs (query strings
included) in its errors and refuses to run when proxy variables are set. Owning the socket
lets a watchdog thread shut it down at the deadline or on cancel, which unblocks any read,
the TLS handshake and the header read included. Proxy variables are ignored on purpose: a
proxy would resolve the name itself and defeat the address check.

Address policy (checked for every resolved address of every hop, redirects included):
public unicast only. ``allow_private_urls`` additionally permits loopback, RFC 1918,
CGNAT and unique-local addresses (tests, same-VPC storage), but link-local (cloud metadata
169.254.169.254, fe80::/10), the AWS IPv6 metadata address fd00:ec2::254, multicast,
unspecified and reserved addresses stay blocked whatever the setting. IPv4-mapped and
NAT64 IPv6 forms are judged by the IPv4 address they carry.

Messages and log lines show a URL only through :func:`redact_url` (no userinfo, no query).
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import functools
import http.client
import ipaddress
import logging
import os
import pathlib
import re
import socket
import ssl
import threading
import time
from urllib.parse import unquote, urljoin, urlsplit

from requests.utils import requote_uri

from handler.errors import Code, WorkerError
from handler.settings import Settings

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_RETRY_BACKOFF_S = (0.3, 0.9)  # two retries of a 5xx, bounded by the total deadline
_WATCHDOG_POLL_S = 0.05
USER_AGENT = "whisper-worker/0.1"
_HOST_RE = re.compile(r"[A-Za-z0-9._-]+")

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_ALWAYS_BLOCKED = [ipaddress.ip_network("fd00:ec2::254/128"), ipaddress.ip_network("0.0.0.0/8")]


# --------------------------------------------------------------------------- redaction


def redact_url(url: str) -> str:
    """``scheme://host[:port]/path``: no userinfo, query or fragment; the only loggable form."""
    try:
        parts = urlsplit(str(url).strip())
        port = parts.port
    except ValueError:
        return "<invalid URL>"
    scheme = parts.scheme.lower()
    if not parts.netloc:
        # data:, mailto:, relative junk: the "path" may be a whole base64 payload.
        return f"{scheme}:" if scheme else "<invalid URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    path = parts.path if len(parts.path) <= 200 else parts.path[:200] + "..."
    text = f"{scheme}://{host}{f':{port}' if port is not None else ''}{path}"
    return "".join(c if c.isprintable() else "?" for c in text)


# --------------------------------------------------------------------------- address policy


def _ipv4_inside(addr: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 form carries: a relay or gateway on the way dials them."""
    inside: list[ipaddress.IPv4Address] = []
    if addr.ipv4_mapped is not None:
        inside.append(addr.ipv4_mapped)  # ::ffff:a.b.c.d is only an envelope
    elif addr in _NAT64:  # so is 64:ff9b::a.b.c.d (a NAT64 gateway dials a.b.c.d)
        inside.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    if addr.sixtofour is not None:  # 2002:AABB:CCDD::/48 (6to4)
        inside.append(addr.sixtofour)
    if addr.teredo is not None:  # 2001:0::/32 (Teredo: server and obfuscated client)
        inside.extend(addr.teredo)
    if int(addr) >> 32 == 0 and int(addr) > 1:  # ::a.b.c.d (IPv4-compatible, deprecated)
        inside.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    return inside


def _reason(a: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_private: bool) -> str | None:
    if a.is_multicast:
        return "multicast"
    if a.is_unspecified or any(a in net for net in _ALWAYS_BLOCKED):
        return "reserved"
    if a.is_link_local:
        return "link-local (cloud metadata)"
    if a.is_loopback:
        return None if allow_private else "loopback"
    if a.is_reserved:
        return "reserved"
    if not (a.is_global and a not in _CGNAT) and not allow_private:
        return "private"
    return None


def blocked_reason(ip: str, allow_private: bool = False) -> str | None:
    """Why ``ip`` may not be dialled (a short label), or None when it may."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return "unparseable address"
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [addr]
    if isinstance(addr, ipaddress.IPv6Address):
        inside = _ipv4_inside(addr)
        # A mapped or NAT64 address is judged by its IPv4 alone; the others by both.
        envelope = addr.ipv4_mapped is not None or addr in _NAT64
        candidates = [*([] if envelope else [addr]), *inside]
    reasons = [why for a in candidates if (why := _reason(a, allow_private)) is not None]
    # The most telling label: Python 3.12's ipaddress calls all of 2002::/16 (6to4) private
    # where 3.11 does not (the image runs 3.12), and the 6to4 form of 169.254.169.254 should
    # still say cloud metadata.
    return next((why for why in reasons if why != "private"), reasons[0] if reasons else None)


@dataclasses.dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # IDNA/ASCII host, no brackets
    port: int
    host_header: str
    path: str  # path and query, percent-quoted
    auth: str | None
    redacted: str


def parse_target(url: str, field: str = "audio_url") -> Target:
    """The request target of ``url``; WorkerError naming ``field`` when it is none."""
    red = redact_url(url)
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise WorkerError(Code.INVALID_INPUT, f"{field} is not a valid URL: {red}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WorkerError(
            Code.URL_NOT_ALLOWED, f"{field}: URL scheme {scheme or '(none)'}: is not allowed: {red}"
        )
    host = parts.hostname or ""
    if ":" not in host:
        try:
            host = host.encode("idna").decode("ascii") if not host.isascii() else host
        except UnicodeError:
            host = ""
        if not _HOST_RE.fullmatch(host):
            host = ""
    if not host:
        raise WorkerError(Code.INVALID_INPUT, f"{field} has no valid host: {red}")
    default = 443 if scheme == "https" else 80
    authority = f"[{host}]" if ":" in host else host
    host_header = authority if port in (None, default) else f"{authority}:{port}"
    path = requote_uri((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    auth = None
    if parts.username is not None:
        creds = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        auth = "Basic " + base64.b64encode(creds).decode("ascii")
    return Target(scheme, host, port or default, host_header, path, auth, red)


# --------------------------------------------------------------------------- deadline/cancel


class Watchdog:
    """Shuts the current socket down at the deadline or on cancel, unblocking any read."""

    def __init__(self, deadline: float, cancel: threading.Event | None) -> None:
        self.deadline = deadline
        self.cancel = cancel
        self.fired: Code | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fetch-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(min(_WATCHDOG_POLL_S, max(0.0, self.remaining()))):
            if self.cancel is not None and self.cancel.is_set():
                self._fire(Code.CANCELLED)
                return
            if self.remaining() <= 0:
                self._fire(Code.SOURCE_TIMEOUT)
                return

    def _fire(self, code: Code) -> None:
        with self._lock:
            self.fired = code
            sock = self._sock
        if sock is not None:
            _shutdown(sock)

    def attach(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            fired = self.fired
        if fired is not None and sock is not None:
            _shutdown(sock)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, what: str) -> None:
        """Raise CANCELLED or SOURCE_TIMEOUT if either has happened (watchdog or not)."""
        if self.fired is None:
            if self.cancel is not None and self.cancel.is_set():
                self.fired = Code.CANCELLED
            elif self.remaining() <= 0:
                self.fired = Code.SOURCE_TIMEOUT
        if self.fired is Code.CANCELLED:
            raise WorkerError(Code.CANCELLED, f"download cancelled: {what}")
        if self.fired is Code.SOURCE_TIMEOUT:
            raise WorkerError(
                Code.SOURCE_TIMEOUT, f"download did not finish within the time limit: {what}"
            )

    def sleep(self, seconds: float) -> None:
        if self.cancel is not None:
            self.cancel.wait(seconds)
        else:
            time.sleep(seconds)


def _shutdown(sock: socket.socket) -> None:
    # The base-class shutdown, not SSLSocket.shutdown, which would drop the SSL object
    # under the reading thread's feet.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


# --------------------------------------------------------------------------- http(s)


_DNS_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fetch-dns")


def resolve(
    t: Target, settings: Settings, wd: Watchdog, trusted: bool = False
) -> list[tuple[int, tuple]]:
    """Every address of the host, each checked; any blocked address refuses the whole host
    (``trusted``: the operator's own S3 endpoint, not checked)."""
    try:
        ipaddress.ip_address(t.host)
        literal = True
    except ValueError:
        literal = False
    if literal:
        # Judge the literal itself first: getaddrinfo could reject it (an unknown zone id)
        # and the error must still be the policy one.
        reason = None if trusted else blocked_reason(t.host, settings.allow_private_urls)
        if reason is not None:
            raise WorkerError(
                Code.URL_NOT_ALLOWED, f"URL not allowed: a {reason} address: {t.redacted}"
            )
        try:
            infos = socket.getaddrinfo(
                t.host, t.port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST
            )
        except OSError:
            raise WorkerError(Code.INVALID_INPUT, f"unusable address: {t.redacted}") from None
    else:
        # getaddrinfo has no timeout of its own: wait for it in a pool, bounded.
        fut = _DNS_POOL.submit(socket.getaddrinfo, t.host, t.port, 0, socket.SOCK_STREAM)
        limit = time.monotonic() + settings.connect_timeout_s
        while True:
            try:
                infos = fut.result(timeout=_WATCHDOG_POLL_S)
                break
            except concurrent.futures.TimeoutError:
                wd.check(t.redacted)
                if time.monotonic() > limit:
                    raise WorkerError(
                        Code.SOURCE_UNREACHABLE, f"could not resolve the host in time: {t.redacted}"
                    ) from None
            except (OSError, UnicodeError):
                raise WorkerError(
                    Code.SOURCE_UNREACHABLE, f"could not resolve the host: {t.redacted}"
                ) from None
    addrs: list[tuple[int, tuple]] = [(family, sockaddr) for family, _, _, _, sockaddr in infos]
    for _, sockaddr in [] if trusted else addrs:
        reason = blocked_reason(str(sockaddr[0]), settings.allow_private_urls)
        if reason is not None:
            raise WorkerError(
                Code.URL_NOT_ALLOWED,
                f"URL not allowed: the host resolves to a {reason} address: {t.redacted}",
            )
    if not addrs:
        raise WorkerError(Code.SOURCE_UNREACHABLE, f"host has no addresses: {t.redacted}")
    return addrs


@functools.lru_cache(maxsize=4)
def _tls_context(cafile: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile)


def _ca_file() -> str | None:
    # Same variables requests honours, then certifi (a requests dependency), then the system.
    env = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
    if env:
        return env
    try:
        import certifi

        return certifi.where()
    except ImportError:
        return None


def connect(t: Target, addrs: list[tuple[int, tuple]], settings: Settings, wd: Watchdog):
    """A connected (and, for https, verified) socket to one of the checked addresses."""
    for family, sockaddr in addrs:
        wd.check(t.redacted)
        sock = socket.socket(family, socket.SOCK_STREAM)
        wd.attach(sock)
        try:
            sock.settimeout(max(0.01, min(settings.connect_timeout_s, wd.remaining())))
            sock.connect(sockaddr)
            if t.scheme == "https":
                sock = _tls_context(_ca_file()).wrap_socket(sock, server_hostname=t.host)
                wd.attach(sock)
            return sock
        except ssl.SSLError:
            sock.close()
            wd.check(t.redacted)
            raise WorkerError(
                Code.SOURCE_UNREACHABLE,
                f"TLS handshake or certificate verification failed: {t.redacted}",
            ) from None
        except OSError:
            sock.close()
            wd.check(t.redacted)  # a timeout at the deadline is SOURCE_TIMEOUT
    raise WorkerError(Code.SOURCE_UNREACHABLE, f"could not connect to the source: {t.redacted}")


def _request(t: Target, settings: Settings, wd: Watchdog, trusted: bool = False):
    sock = connect(t, resolve(t, settings, wd, trusted), settings, wd)
    conn = http.client.HTTPConnection(t.host, t.port)
    conn.sock = sock  # already connected to the pinned address; no second lookup
    try:
        sock.settimeout(max(0.01, wd.remaining() + 1.0))  # backstop behind the watchdog
        conn.putrequest("GET", t.path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", t.host_header)
        # identity: a gzip bomb stays compressed on disk and its raw bytes are what we count.
        conn.putheader("Accept-Encoding", "identity")
        conn.putheader("User-Agent", USER_AGENT)
        conn.putheader("Accept", "*/*")
        conn.putheader("Connection", "close")
        if t.auth:
            conn.putheader("Authorization", t.auth)
        conn.endheaders()
        return conn, conn.getresponse()
    except (OSError, http.client.HTTPException, ValueError):
        conn.close()
        wd.check(t.redacted)
        raise WorkerError(
            Code.SOURCE_UNREACHABLE, f"the source closed the connection: {t.redacted}"
        ) from None


def fetch_url(
    url: str,
    dest: pathlib.Path,
    settings: Settings,
    *,
    cancel: threading.Event | None = None,
    trusted_origin: bool = False,
    display: str | None = None,
    deadline: float | None = None,
) -> int:
    """GET an http(s) URL into ``dest`` (SSRF-guarded, capped, one total deadline).

    For S3 (``sources.fetch_s3``): ``trusted_origin`` exempts the URL's own host and port
    from the address policy (an operator-configured endpoint such as MinIO on a private
    address; redirects elsewhere are still checked), ``display`` is what messages name
    instead of the URL (the ``s3://`` form, never the signed query), ``deadline`` is a
    ``time.monotonic()`` instant already running.
    """
    started = time.monotonic()
    red = display or redact_url(url)
    try:
        end = started + settings.download_timeout_s if deadline is None else deadline
        with Watchdog(end, cancel) as wd:
            size = _fetch(url, dest, settings, wd, trusted_origin, display)
    except BaseException as exc:
        pathlib.Path(dest).unlink(missing_ok=True)
        if isinstance(exc, WorkerError):
            log.warning("fetch failed: %s (%s)", exc.code.value, red)
        raise
    log.info("fetched %d bytes in %.2fs from %s", size, time.monotonic() - started, red)
    return size


def _fetch(
    url: str,
    dest: pathlib.Path,
    settings: Settings,
    wd: Watchdog,
    trusted_origin: bool = False,
    display: str | None = None,
) -> int:
    current, seen, hops, retries = url, set(), 0, 0
    t = parse_target(current)
    if display:
        t = dataclasses.replace(t, redacted=display)
    trusted = (t.scheme, t.host, t.port) if trusted_origin else None
    while True:
        conn, resp = _request(t, settings, wd, trusted=(t.scheme, t.host, t.port) == trusted)
        try:
            status = resp.status
            if status in _REDIRECT_STATUSES:
                location = resp.getheader("Location")
                if not location:
                    raise WorkerError(
                        Code.SOURCE_HTTP_4XX, f"HTTP {status} without a Location: {t.redacted}"
                    )
                seen.add(current)
                nxt = urljoin(current, location.strip())
                hops += 1
                if nxt in seen:
                    raise WorkerError(Code.URL_NOT_ALLOWED, f"redirect loop at {t.redacted}")
                if hops > settings.max_redirects:
                    raise WorkerError(
                        Code.URL_NOT_ALLOWED,
                        f"more than {settings.max_redirects} redirects, last from {t.redacted}",
                    )
                prev, current, t = t, nxt, parse_target(nxt)
                if (t.scheme, t.host, t.port) != (prev.scheme, prev.host, prev.port):
                    t = dataclasses.replace(t, auth=None)  # credentials stay with their host
                log.info("following HTTP %d redirect to %s", status, t.redacted)
                continue
            if status >= 500:
                if retries < len(_RETRY_BACKOFF_S) and wd.remaining() > _RETRY_BACKOFF_S[retries]:
                    log.warning("HTTP %d from %s; retrying", status, t.redacted)
                    wd.sleep(_RETRY_BACKOFF_S[retries])
                    wd.check(t.redacted)
                    retries += 1
                    continue
                raise WorkerError(Code.SOURCE_HTTP_5XX, f"HTTP {status} from {t.redacted}")
            if not 200 <= status < 300:
                # 408/429 say "later": worth a resubmit; other 4xx (expired link) are not.
                raise WorkerError(
                    Code.SOURCE_HTTP_4XX,
                    f"HTTP {status} from {t.redacted}",
                    retryable=status in (408, 429),
                )
            return _stream_body(resp, dest, settings, wd, t.redacted)
        finally:
            conn.close()


def _stream_body(resp, dest: pathlib.Path, settings: Settings, wd: Watchdog, red: str) -> int:
    cap = settings.max_download_bytes
    declared = None if resp.chunked else resp.length  # parsed Content-Length, captured first
    if declared is not None and declared > cap:
        raise too_large(red, cap)
    total = 0
    with open(dest, "wb") as out:
        while True:
            wd.check(red)
            try:
                chunk = resp.read1(CHUNK_BYTES)  # at most one recv: no waiting for a full buffer
            except (OSError, http.client.HTTPException, ValueError):
                wd.check(red)
                raise WorkerError(
                    Code.SOURCE_TRUNCATED, f"the connection broke before the body ended: {red}"
                ) from None
            if not chunk:
                break
            total += len(chunk)
            if total > cap:
                raise too_large(red, cap)
            out.write(chunk)
    wd.check(red)  # an EOF may be the watchdog's shutdown
    if declared is not None and total < declared:
        raise WorkerError(
            Code.SOURCE_TRUNCATED,
            f"body ended after {total} of {declared} bytes (Content-Length): {red}",
        )
    return total


def too_large(red: str, cap: int) -> WorkerError:
    """SOURCE_TOO_LARGE for a body over ``cap`` bytes (declared or counted)."""
    return WorkerError(Code.SOURCE_TOO_LARGE, f"source is larger than {cap} bytes: {red}")
