"""A fake OpenAI-compatible chat-completions server for the judge tests.

A real ``http.server`` on 127.0.0.1 (random port, one thread per request).
``POST /v1/chat/completions`` answers according to a case marker ``CASE=<name>``
found in the request's messages; a request with more than two messages is the
judge's repair request for that case.  Each case counts its attempts so that
"fail first, then succeed" behaviours can be expressed.

Cases (first answer / repair answer):

=============  ===========================================================
valid          Sotopia-style JSON (``[reasoning, score]`` pairs)
prose          the JSON inside prose
fenced         the JSON (``{"reasoning", "score"}`` objects) in a ```json fence
out_of_range   agent 1's secret is +3 / a valid answer
missing_dim    agent 2's goal missing / still missing
garbage        no JSON at all / still none
http500        HTTP 500 on the first attempt, then valid
http429        HTTP 429 (Retry-After: 0) on the first attempt, then valid
hang           sleeps ``hang_seconds`` (past the client's timeout) on the first
               attempt, then valid
drop           closes the connection without answering on the first attempt,
               then valid
always500      HTTP 500 every time
echo_key       HTTP 400 whose body echoes the Authorization header
=============  ===========================================================

When ``api_key`` is set, requests without ``Authorization: Bearer <key>`` get
HTTP 401.  A request without a case marker is answered as ``default_case``.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from synclib.judge import DIMENSIONS, SCORE_RANGES

CASE_RE = re.compile(r"CASE=([a-z0-9_]+)")


def served_score(agent: int, dim_index: int) -> int:
    """The score the fake judge gives (deterministic, within range)."""
    lo, hi = SCORE_RANGES[DIMENSIONS[dim_index]]
    return lo + (3 * dim_index + 5 * agent) % (hi - lo + 1)


def evaluation(style: str = "pairs", drop: tuple[int, str] | None = None,
               override: dict | None = None) -> dict:
    """A full evaluation object; ``drop`` leaves one (agent, dim) out,
    ``override`` maps (agent, dim) to a replacement score."""
    out = {}
    for a in (1, 2):
        block = {}
        for i, d in enumerate(DIMENSIONS):
            if drop == (a, d):
                continue
            s = (override or {}).get((a, d), served_score(a, i))
            reason = f"agent {a} on {d}: reasons {{with braces}} and \"quotes\""
            block[d] = [reason, s] if style == "pairs" else {"reasoning": reason, "score": s}
        out[f"agent_{a}_evaluation"] = block
    return out


class FakeJudgeServer:
    """Context manager running the fake server.

    Attributes
    ----------
    url : str
        Base URL (``http://127.0.0.1:PORT/v1``).
    requests : Counter
        Requests received per case (repairs counted as ``<case>:repair``).
    bodies : list of dict
        Every request body received.
    """

    def __init__(self, api_key: str | None = None, hang_seconds: float = 2.0,
                 default_case: str = "unknown"):
        self.api_key = api_key
        self.default_case = default_case
        self.hang_seconds = hang_seconds
        self.requests: Counter = Counter()
        self.bodies: list[dict] = []
        self.auth_failures = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                server._handle(self, body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def __enter__(self) -> "FakeJudgeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # ------------------------------------------------------------------------------
    def _send(self, h: BaseHTTPRequestHandler, status: int, payload, headers=None) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout case)

    def _answer(self, h, text: str) -> None:
        self._send(h, 200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake-judge",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
        })

    def _handle(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        auth = h.headers.get("Authorization", "")
        msgs = body.get("messages", [])
        text = "\n".join(str(m.get("content", "")) for m in msgs)
        m = CASE_RE.search(text)
        case = m.group(1) if m else self.default_case
        repair = len(msgs) > 2
        key = f"{case}:repair" if repair else case
        with self._lock:
            self.requests[key] += 1
            self.bodies.append(body)
            attempt = self.requests[key]
        if self.api_key is not None and auth != f"Bearer {self.api_key}" and case != "echo_key":
            with self._lock:
                self.auth_failures += 1
            return self._send(h, 401, {"error": "unauthorized"})
        valid = json.dumps(evaluation("pairs"))
        if case == "valid":
            return self._answer(h, valid)
        if case == "prose":
            return self._answer(h, f"Sure! Here is my evaluation: {valid} I hope it helps {{:)}}.")
        if case == "fenced":
            return self._answer(h, "My evaluation:\n```json\n"
                                + json.dumps(evaluation("objects"), indent=2) + "\n```\nDone.")
        if case == "out_of_range":
            if repair:
                return self._answer(h, valid)
            return self._answer(h, json.dumps(evaluation(override={(1, "secret"): 3})))
        if case == "missing_dim":
            return self._answer(h, json.dumps(evaluation(drop=(2, "goal"))))
        if case == "garbage":
            return self._answer(h, "I am unable to provide scores for this conversation.")
        if case == "http500":
            if attempt == 1:
                return self._send(h, 500, {"error": "internal error"})
            return self._answer(h, valid)
        if case == "http429":
            if attempt == 1:
                return self._send(h, 429, {"error": "rate limited"}, {"Retry-After": "0"})
            return self._answer(h, valid)
        if case == "hang":
            if attempt == 1:
                time.sleep(self.hang_seconds)
            return self._answer(h, valid)
        if case == "drop":
            if attempt == 1:
                h.close_connection = True
                try:
                    h.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return None
            return self._answer(h, valid)
        if case == "always500":
            return self._send(h, 500, {"error": "down"})
        if case == "echo_key":
            return self._send(h, 400, f"bad request; you sent Authorization: {auth}")
        return self._send(h, 404, {"error": f"unknown case {case!r}"})
