"""An HTTP proxy in front of kinesalite that makes `PutRecords` fail the way Kinesis does under load.

kinesalite never throttles, so the producer's retries are tested through this proxy, on the wire: boto3 talks
to the proxy exactly as to Kinesis. Every ``throttle_every``-th `PutRecords` call is refused whole (HTTP 400
``ProvisionedThroughputExceededException``, nothing written); of the others, each entry fails with probability
``fail_ratio`` (``ProvisionedThroughputExceededException`` or ``InternalFailure`` in its result, and it is
*not* forwarded, so it is not written), as a partially failed call is. Every other request passes unchanged.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

PUT_RECORDS = "Kinesis_20131202.PutRecords"
_HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding"}


class KinesisFaults:
    def __init__(self, upstream: str, throttle_every: int = 4, fail_ratio: float = 0.2, seed: int = 5) -> None:
        target = urlparse(upstream)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self.throttle_every = throttle_every
        self.fail_ratio = fail_ratio
        self.random = random.Random(seed)
        self.calls = 0
        self.throttled = 0
        self.failed_entries = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, payload = proxy.handle(self.headers.get("X-Amz-Target", ""), dict(self.headers), body)
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> KinesisFaults:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _forward(self, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            kept = {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}
            conn.request("POST", "/", body=body, headers=kept)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def handle(self, target: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if target != PUT_RECORDS:
            return self._forward(headers, body)
        with self._lock:
            self.calls += 1
            if self.calls % self.throttle_every == 0:
                self.throttled += 1
                return 400, json.dumps(
                    {
                        "__type": "ProvisionedThroughputExceededException",
                        "message": "Rate exceeded for shard shardId-000000000000 in stream (test proxy).",
                    }
                ).encode()
            request = json.loads(body)
            entries = request["Records"]
            failing = [self.random.random() < self.fail_ratio for _ in entries]
            if all(failing):
                failing[0] = False
            self.failed_entries += sum(failing)
        request["Records"] = [e for e, fail in zip(entries, failing, strict=True) if not fail]
        status, payload = self._forward(headers, json.dumps(request).encode())
        if status != 200:
            return status, payload
        written = iter(json.loads(payload)["Records"])
        results = []
        for i, fail in enumerate(failing):
            if fail:
                code = "InternalFailure" if i % 2 else "ProvisionedThroughputExceededException"
                results.append({"ErrorCode": code, "ErrorMessage": "injected by the test proxy"})
            else:
                results.append(next(written))
        return 200, json.dumps({"FailedRecordCount": sum(failing), "Records": results}).encode()
