"""Tests of synclib.judge: prompts, parsing, the HTTP judge against a real local
server, constrained scoring with a real (tiny and embedded) model, cube input,
summaries, what reading scores imports, and the CLI."""
from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from synclib import judge as J
from synclib.engine import Engine
from synclib.judge import DIMENSIONS, SCORE_RANGES, JudgeItem
from synclib.judge.backends import _terminator_id
from synclib.judge.rubric import AGENT_KEYS

from conftest import sotopia_folder
from judge_server import FakeJudgeServer, check_response_format, evaluation, served_score

SECRET = "sk-test-3f9a7c1e5b2d4a6f8e0c1b3d5f7a9c2e"
ALL_CASES = ["valid", "prose", "fenced", "out_of_range", "missing_dim", "garbage", "http500",
             "http429", "hang", "drop", "always500", "echo_key", "structured"]
CLEAN_CASES = ["valid", "prose", "fenced", "out_of_range", "http500", "http429", "hang", "drop",
               "structured"]


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory) -> Path:
    """A task folder with a judge_instructions.txt: the paper's Sotopia tasks where the suite
    has them (conftest.sotopia_folder), else a copy of the embedded tasks with instructions of
    our own, so that these tests run on any machine."""
    import shutil

    from synclib.tasks.scenarios import embedded_dir

    found = sotopia_folder()
    if found is not None:
        return found
    d = tmp_path_factory.mktemp("tasks")
    for f in ("envs.json", "agents.json", "env_agent_combos.json"):
        shutil.copy(embedded_dir() / f, d / f)
    (d / "judge_instructions.txt").write_text(
        "Rate how well each participant reached their goal, using the schema below.\n" + J.EMBEDDED_INSTRUCTIONS,
        encoding="utf-8")
    return d


def make_item(case: str, episode: int = 0, seed: int = 0, n: int = 4) -> JudgeItem:
    names = ("Ava Martinez", "Ben Okafor")
    utts = tuple(f"utterance {t} by {names[t % 2].split()[0]}" for t in range(n))
    intro = (f"Here is the context of this interaction:\nScenario: test scenario CASE={case}\n"
             f"Participants: {names[0]} and {names[1]}")
    return JudgeItem(episode, 100 + episode, seed, intro, names, utts)


# ------------------------------------------------------------------------------ prompts

def test_transcript_and_prompt_layout():
    item = make_item("valid", n=3)
    lines = J.render_transcript(item.agent_names, item.utterances).splitlines()
    assert lines == ['Turn #0: Ava Martinez said: "utterance 0 by Ava"',
                     'Turn #1: Ben Okafor said: "utterance 1 by Ben"',
                     'Turn #2: Ava Martinez said: "utterance 2 by Ava"']
    msgs = J.judge_messages(item, "INSTRUCTIONS HERE")
    assert msgs[0] == {"role": "system", "content": "You are a helpful assistant."}
    assert len(msgs) == 2 and msgs[1]["role"] == "user"
    user = msgs[1]["content"]
    assert user.startswith(item.intro) and user.endswith("INSTRUCTIONS HERE")
    assert user.index("Participants") < user.index("Turn #0") < user.index("Turn #2") \
        < user.index("INSTRUCTIONS")


def test_instructions_from_scenarios_dir_or_embedded(tmp_path, tasks_dir):
    text, src = J.load_instructions(tasks_dir)
    assert text == (tasks_dir / "judge_instructions.txt").read_text() and src.endswith(
        "judge_instructions.txt")
    assert J.load_instructions("embedded") == (J.EMBEDDED_INSTRUCTIONS, "embedded")
    assert J.load_instructions(tmp_path)[1] == "embedded"  # a directory without the file
    with pytest.raises(J.JudgeError, match="nope"):
        J.load_instructions(tmp_path / "nope")
    # the embedded instructions carry a JSON schema with every dimension and range
    schema = json.loads(re.search(r"```\n(.*?)\n```", J.EMBEDDED_INSTRUCTIONS, re.S).group(1))
    for key in AGENT_KEYS:
        props = schema["properties"][key]["properties"]
        assert set(props) == set(DIMENSIONS)
        for d, (lo, hi) in SCORE_RANGES.items():
            s = props[d]["properties"]["score"]
            assert (s["type"], s["minimum"], s["maximum"]) == ("integer", lo, hi)


# ------------------------------------------------------------------------------ parsing

def test_extract_json_in_prose_fence_and_garbage():
    obj = evaluation()
    raw = json.dumps(obj)
    assert J.extract_json(raw) == obj
    assert J.extract_json(f"Sure {{not json}} here: {raw} bye }}") == obj
    assert J.extract_json(f"text\n```json\n{raw}\n```\nmore") == obj
    assert J.extract_json("no json at all") is None
    assert J.extract_json("") is None


def test_parse_evaluation_validates_every_field():
    valid, errors = J.parse_evaluation(json.dumps(evaluation("objects")))
    assert not errors and len(valid) == 14
    assert valid[(2, "goal")][1] == served_score(2, DIMENSIONS.index("goal"))

    bad = evaluation(override={(1, "secret"): 3, (2, "knowledge"): True, (2, "goal"): 7.0,
                               (1, "relationship"): "4"}, drop=(2, "believability"))
    valid, errors = J.parse_evaluation(json.dumps(bad))
    assert set(valid) | set(errors) == {(a, d) for a in (1, 2) for d in DIMENSIONS}
    assert "out of range [-10, 0]" in errors[(1, "secret")]
    assert "not an integer" in errors[(2, "knowledge")]  # a bool is no score
    assert "not an integer" in errors[(1, "relationship")]
    assert "missing" in errors[(2, "believability")]
    assert valid[(2, "goal")][1] == 7  # an integral float is accepted
    valid, errors = J.parse_evaluation("nothing here")
    assert not valid and set(errors.values()) == {"no JSON object found"}


def test_parse_accepts_tuple_and_object_forms():
    """Sotopia's [reasoning, score] tuples (what the paper's instructions ask for) and the
    {"reasoning", "score"} objects of structured output read the same, even mixed."""
    pairs, objects = evaluation("pairs"), evaluation("objects")
    assert isinstance(pairs["agent_1_evaluation"]["goal"], list)
    assert isinstance(objects["agent_1_evaluation"]["goal"], dict)
    v_pairs, e_pairs = J.parse_evaluation(json.dumps(pairs))
    v_objects, e_objects = J.parse_evaluation(json.dumps(objects))
    assert not e_pairs and not e_objects and v_pairs == v_objects and len(v_pairs) == 14
    mixed = {"agent_1_evaluation": pairs["agent_1_evaluation"],
             "agent_2_evaluation": objects["agent_2_evaluation"]}
    assert J.parse_evaluation(json.dumps(mixed)) == (v_pairs, {})
    # strict either way: an object lacking a key, a triple, a score out of range
    bad = evaluation("objects")
    del bad["agent_1_evaluation"]["goal"]["score"]
    del bad["agent_2_evaluation"]["secret"]["reasoning"]
    bad["agent_1_evaluation"]["knowledge"] = ["why", 3, "extra"]
    bad["agent_2_evaluation"]["relationship"] = {"reasoning": "r", "score": 6}
    valid, errors = J.parse_evaluation(json.dumps(bad))
    assert len(valid) == 10
    assert errors[(1, "goal")] == "agent_1_evaluation.goal object lacks 'score'"
    assert errors[(2, "secret")] == "agent_2_evaluation.secret object lacks 'reasoning'"
    assert "neither a [reasoning, score] pair nor" in errors[(1, "knowledge")]
    assert "score 6 out of range [-5, 5]" in errors[(2, "relationship")]


# ------------------------------------------------------------------------------ HTTP judge

def run_http_batch(server, cache_path, concurrency=4):
    backend = J.OpenAIBackend(J.JudgeConnection("fake-judge", server.url, api_key_env="SYNCLIB_TEST_KEY",
                                                timeout=0.5, max_retries=2, backoff=0.01, max_backoff=0.05))
    items = [make_item(c, episode=i) for i, c in enumerate(ALL_CASES)]
    t0 = time.perf_counter()
    table = J.judge_items(items, backend, mode="json", cache=J.JudgeCache(cache_path),
                          instructions=J.EMBEDDED_INSTRUCTIONS, concurrency=concurrency,
                          progress=False)
    backend.close()
    return table, backend, time.perf_counter() - t0


def test_http_judge_every_case_and_cache(tmp_path, monkeypatch, caplog, capsys):
    monkeypatch.setenv("SYNCLIB_TEST_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    cache_path = tmp_path / "pair.judge-cache.jsonl"
    with FakeJudgeServer(api_key=SECRET, hang_seconds=2.0) as server:
        table, backend, _ = run_http_batch(server, cache_path)
        first_requests = server.total_requests
        first_counts = dict(server.requests)
        assert server.auth_failures == 0  # the key was sent
        # structured output was asked for in every request (repairs too), the schema was
        # accepted, and a 400 about something else (echo_key) was no refusal of it
        assert all(f is not None for f in server.response_formats)
        assert server.format_problems == [] and not backend.structured_refused

        assert len(table) == 14 * len(ALL_CASES)
        by_case = {c: table[table.episode == i] for i, c in enumerate(ALL_CASES)}
        expected = [served_score(a, i) for a in (1, 2) for i in range(len(DIMENSIONS))]
        for c in CLEAN_CASES:
            t = by_case[c]
            assert list(t.score) == expected, c
            assert (t.error == "").all() and (t["mode"] == "json").all() and (t.judge == "fake-judge").all()
            assert t.reasoning.str.contains("braces").all()
        # out of range: repaired once
        assert server.requests["out_of_range:repair"] == 1
        # missing dimension: repair asked once, still missing -> that field alone missing
        t = by_case["missing_dim"]
        assert server.requests["missing_dim:repair"] == 1
        miss = t[t.score.isna()]
        assert list(zip(miss.agent, miss.dimension)) == [(2, "goal")]
        assert "missing" in miss.error.iloc[0] and "repair" in miss.error.iloc[0]
        assert '"agent_1_evaluation"' in miss.raw.iloc[0]
        # garbage: all 14 missing with the reason and the raw text, no score made up
        t = by_case["garbage"]
        assert t.score.isna().all() and server.requests["garbage:repair"] == 1
        assert t.error.str.contains("no JSON object found").all()
        assert t.raw.str.contains("unable to provide scores").all()
        # transient failures were retried once each; permanent ones gave up
        for c in ("http500", "http429", "hang", "drop"):
            assert server.requests[c] == 2, c
        t = by_case["always500"]
        assert t.score.isna().all() and t.error.str.contains("gave up after 3 attempts").all()
        assert server.requests["always500"] == 3
        t = by_case["echo_key"]
        assert t.score.isna().all() and server.requests["echo_key"] == 1  # 400: no retry
        assert t.error.str.contains("HTTP 400").all() and t.error.str.contains(r"\*\*\*").all()
        assert backend.requests_sent == first_requests

        # second run: everything paid for comes from the cache, zero requests
        out = tmp_path / "pair.judge.csv"
        J.save_table(table, out)
        table2, backend2, _ = run_http_batch(server, cache_path)
        failed_requests = 3 + 1  # always500 (3 attempts) and echo_key are never cached
        assert server.total_requests - first_requests == failed_requests
        assert backend2.requests_sent == failed_requests
        pd.testing.assert_frame_equal(table2, table)
        J.save_table(table2, out)

    # the cache file holds one line per paid-for answer
    lines = cache_path.read_text().splitlines()
    unpaid = first_counts["always500"] + first_counts["echo_key"] + 4  # + 1st try of 4 cases
    assert len(lines) == first_requests - unpaid == len(CLEAN_CASES) + 2 + 3  # 3 repairs
    # the key is nowhere: table, cache, logs, captured output, repr
    captured = capsys.readouterr()
    for text in (out.read_text(), cache_path.read_text(), caplog.text, captured.out,
                 captured.err, repr(backend)):
        assert SECRET not in text
    assert J.read_table(out).score.equals(table.score)


def http_backend(server, **sampling):
    return J.OpenAIBackend(J.JudgeConnection("fake-judge", server.url, api_key_env="SYNCLIB_UNSET_VAR",
                                             timeout=5, max_retries=1, backoff=0.01, max_backoff=0.05),
                           J.JudgeSampling(**sampling))


def test_structured_request_carries_strict_object_schema():
    """The request body holds an OpenAI json_schema response_format: strict, one object per
    dimension (bounded reasoning, score within the dimension's range), no tuples."""
    with FakeJudgeServer() as server:
        backend = http_backend(server)
        J.judge_items([make_item("valid"), make_item("out_of_range", 1)], backend,
                      concurrency=1, progress=False)
        backend120 = http_backend(server, reasoning_max_chars=120)
        J.judge_items([make_item("valid", 2)], backend120, progress=False)
    assert server.requests["out_of_range:repair"] == 1
    fmts = server.response_formats
    assert len(fmts) == 4 and all(f is not None for f in fmts)  # the repair request too
    assert server.format_problems == []
    fmt = fmts[0]
    assert check_response_format(fmt) == []
    assert fmt["type"] == "json_schema" and set(fmt) == {"type", "json_schema"}
    js = fmt["json_schema"]
    assert js["name"] == "sotopia_evaluation" and js["strict"] is True
    assert set(js) == {"name", "schema", "strict"}
    schema = js["schema"]
    assert schema["type"] == "object" and schema["required"] == list(AGENT_KEYS)
    assert schema["additionalProperties"] is False
    for key in AGENT_KEYS:
        agent = schema["properties"][key]
        assert agent["type"] == "object" and agent["required"] == list(DIMENSIONS)
        assert list(agent["properties"]) == list(DIMENSIONS)
        for d, (lo, hi) in SCORE_RANGES.items():
            dim = agent["properties"][d]
            assert dim["type"] == "object" and dim["required"] == ["reasoning", "score"]
            assert dim["additionalProperties"] is False
            assert list(dim["properties"]) == ["reasoning", "score"]  # reasoning first
            assert dim["properties"]["reasoning"] == {"type": "string",
                                                      "maxLength": J.REASONING_MAX_CHARS}
            assert dim["properties"]["score"] == {"type": "integer", "minimum": lo, "maximum": hi}
    text = json.dumps(fmt)
    assert "prefixItems" not in text and '"array"' not in text and "$ref" not in text
    assert fmt == backend.response_format() == {"type": "json_schema", "json_schema": {
        "name": "sotopia_evaluation", "schema": J.structured_schema(), "strict": True}}
    assert json.dumps(fmts[3]).count('"maxLength": 120') == 14
    # what the schema admits: the object form, not Sotopia's tuples, nor long reasoning
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    assert validator.is_valid(evaluation("objects"))
    assert not validator.is_valid(evaluation("pairs"))
    assert not validator.is_valid(evaluation("objects", override={(1, "secret"): 3}))
    long = evaluation("objects")
    long["agent_2_evaluation"]["goal"]["reasoning"] = "x" * (J.REASONING_MAX_CHARS + 1)
    assert not validator.is_valid(long)
    # the bound keeps below llama.cpp's grammar repetition limit
    for bad in (0, 2000, 1.5, True):
        with pytest.raises(J.JudgeError, match="reasoning_max_chars"):
            J.structured_schema(bad)


@pytest.mark.parametrize("chars", [1, 120, J.REASONING_MAX_CHARS, 1999])
def test_token_budget_covers_the_longest_valid_answer(chars, caplog):
    """max_tokens is sized from the schema: the longest valid answer, as any server could
    lay it out compactly or indented, fits the budget; a smaller max_tokens is warned about."""
    jsonschema = pytest.importorskip("jsonschema")
    budget = J.structured_token_budget(chars)
    longest = evaluation("objects")
    for agent in longest.values():
        for dim, v in agent.items():
            lo, hi = SCORE_RANGES[dim]
            v.update(reasoning="é" * chars, score=lo if len(str(lo)) > len(str(hi)) else hi)
    assert jsonschema.Draft202012Validator(J.structured_schema(chars)).is_valid(longest)
    for layout in ({}, {"indent": 2}, {"ensure_ascii": False, "indent": 1}):
        assert len(json.dumps(longest, **layout).replace("\\u00e9", "x")) <= budget
    caplog.set_level(logging.WARNING)
    conn = J.JudgeConnection("m", "http://127.0.0.1:9/v1", api_key_env="SYNCLIB_UNSET_VAR")
    J.OpenAIBackend(conn, J.JudgeSampling(max_tokens=budget, reasoning_max_chars=chars))
    J.OpenAIBackend(conn, J.JudgeSampling(max_tokens=50, reasoning_max_chars=chars, structured=False))
    assert not [r for r in caplog.records if "max_tokens" in r.getMessage()]
    J.OpenAIBackend(conn, J.JudgeSampling(max_tokens=budget - 1, reasoning_max_chars=chars))
    warned = [r.getMessage() for r in caplog.records if "max_tokens" in r.getMessage()]
    assert len(warned) == 1 and f"max_tokens={budget - 1}" in warned[0] and str(budget) in warned[0]


def test_object_form_answers_fill_the_table():
    """A server enforcing the schema answers in the object form: every field is scored."""
    with FakeJudgeServer() as server:
        backend = http_backend(server)
        items = [make_item("structured", e, n=2 + e) for e in range(3)]
        table = J.judge_items(items, backend, concurrency=2, progress=False)
    assert server.total_requests == 3 and all(server.response_formats)
    raw = server.bodies[0]  # the server answered objects because the format was sent
    assert raw["response_format"]["json_schema"]["strict"] is True
    expected = [served_score(a, i) for a in (1, 2) for i in range(len(DIMENSIONS))]
    for e in range(3):
        t = table[table.episode == e]
        assert list(t.score) == expected and (t.error == "").all()
        assert t.reasoning.str.startswith("agent ").all()


@pytest.mark.parametrize("status", [400, 422])
def test_refused_response_format_falls_back_once_and_is_remembered(status, caplog):
    """llama.cpp refuses a schema with HTTP 400 (a FastAPI server with 422): the request is
    sent once more without response_format, and later requests go without it."""
    caplog.set_level(logging.INFO)
    items = [make_item("valid", 0), make_item("structured", 1), make_item("prose", 2)]
    with FakeJudgeServer(refuse_response_format=status) as server:
        backend = http_backend(server)
        cache = J.JudgeCache(None)
        table = J.judge_items(items, backend, cache=cache, concurrency=1, progress=False)
        assert server.refusals == 1 and server.total_requests == 4
        assert backend.requests_sent == 4 and backend.structured_refused
        assert server.response_formats[0] is not None
        assert server.response_formats[1:] == [None, None, None]
        first = dict(server.bodies[0])
        del first["response_format"]
        assert server.bodies[1] == first  # the same request, without the format
        assert table.score.notna().all() and (table.error == "").all()
        warnings = [r for r in caplog.records if "refused structured output" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        # the answers are cached under what was requested: the same run again asks nothing
        again = J.judge_items(items, http_backend(server), cache=cache, progress=False)
        assert server.total_requests == 4
        pd.testing.assert_frame_equal(again, table)
        # a new run (new backend, empty cache) tries structured output again, once
        backend2 = http_backend(server)
        J.judge_items(items[:2], backend2, concurrency=1, progress=False)
        assert server.refusals == 2 and server.total_requests == 4 + 3
    assert server.format_problems == []


def test_refusal_under_concurrency_is_logged_once(caplog):
    """Requests in flight when the refusal comes each fall back once; one warning in all."""
    caplog.set_level(logging.INFO)
    items = [make_item("structured", e, n=2 + e) for e in range(8)]  # 8 distinct dialogs
    with FakeJudgeServer(refuse_response_format=400) as server:
        backend = http_backend(server)
        table = J.judge_items(items, backend, concurrency=4, progress=False)
    assert 1 <= server.refusals <= 4
    assert server.total_requests == len(items) + server.refusals
    assert sum(f is None for f in server.response_formats) == len(items)
    assert table.score.notna().all()
    assert sum("refused structured output" in r.getMessage() for r in caplog.records) == 1


def test_plain_json_mode_sends_no_response_format():
    """structured=False (backend or judge_items) is JSON mode as before; a 400 about the
    request is then no refusal of anything."""
    with FakeJudgeServer(refuse_response_format=400) as server:
        backend = http_backend(server, structured=False)
        assert backend.response_format() is None
        table = J.judge_items([make_item("valid"), make_item("structured", 1)], backend,
                              progress=False)
        assert table.score.notna().all() and server.refusals == 0
        backend2 = http_backend(server)  # structured by default, turned off per call
        J.judge_items([make_item("prose", 2)], backend2, structured=False, progress=False)
        assert server.response_formats == [None, None, None] and not backend2.structured_refused
    with FakeJudgeServer() as server:  # ... and turned on per call
        J.judge_items([make_item("structured")], http_backend(server, structured=False),
                      structured=True, progress=False)
        assert server.response_formats[0] is not None


def test_cache_keys_tell_structured_from_plain(tmp_path):
    from synclib.judge.cache import cache_key

    with FakeJudgeServer() as server:
        backend = http_backend(server)
        msgs = J.judge_messages(make_item("valid"), J.EMBEDDED_INSTRUCTIONS)
        k_on, k_off = J.request_key(backend, msgs, True), J.request_key(backend, msgs, False)
        assert k_on != k_off and J.request_key(backend, msgs) == k_on  # the backend's default
        # plain JSON mode keeps the key of caches written before structured output
        assert k_off == cache_key("fake-judge", {"settings": backend.settings, "messages": msgs})
        assert J.request_key(http_backend(server, structured=False), msgs) == k_off
        # the schema (its reasoning bound) is part of the key
        assert J.request_key(http_backend(server, reasoning_max_chars=100), msgs) != k_on

        # one cache file: structured answers and plain ones are kept apart
        path = tmp_path / "c.jsonl"
        items = [make_item("structured", e, n=2 + e) for e in range(2)]
        on = J.judge_items(items, backend, cache=J.JudgeCache(path), progress=False)
        assert server.total_requests == 2
        off = J.judge_items(items, backend, cache=J.JudgeCache(path), structured=False,
                            progress=False)
        assert server.total_requests == 4  # not served from the structured answers
        assert server.response_formats[2:] == [None, None]
        for structured in (True, False):
            J.judge_items(items, backend, cache=J.JudgeCache(path), structured=structured,
                          progress=False)
        assert server.total_requests == 4  # both kinds now come from the cache
    assert len(path.read_text().splitlines()) == 4
    pd.testing.assert_frame_equal(on, off)  # same scores, whichever form the answer took


def test_interrupted_run_keeps_paid_answers(tmp_path):
    """Answers are flushed one by one: a cache written by a run cut short serves them."""
    cache_path = tmp_path / "c.jsonl"
    with FakeJudgeServer() as server:
        backend = J.OpenAIBackend(J.JudgeConnection("fake-judge", server.url,
                                                    api_key_env="SYNCLIB_UNSET_VAR", timeout=5, max_retries=0))
        cache = J.JudgeCache(cache_path)
        J.judge_items([make_item("valid", 0)], backend, cache=cache, progress=False)
        with open(cache_path, "a") as f:  # a torn line, as a crash mid-write leaves it
            f.write('{"key": "abc", "val')
        before = server.total_requests
        items = [make_item("valid", 0), make_item("prose", 1)]
        table = J.judge_items(items, backend, cache=J.JudgeCache(cache_path), progress=False)
        assert server.total_requests - before == 1  # only the new item was asked
        assert table.score.notna().all()
    # the torn line was cut off, so the new answer got a line of its own: every line parses
    lines = cache_path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["key"] for x in lines)
    assert cache_path.read_text().endswith("\n")


def test_a_damaged_cache_line_is_named_and_nothing_is_lost(tmp_path):
    cache_path = tmp_path / "c.jsonl"
    good = json.dumps({"key": "k1", "judge": "j", "value": {"a": 1}})
    cache_path.write_text(good + "\n{not json}\n" + good.replace("k1", "k2") + "\n")
    before = cache_path.read_bytes()
    with pytest.raises(J.JudgeError, match=r"c\.jsonl:2: damaged judge cache line"):
        J.JudgeCache(cache_path)
    assert cache_path.read_bytes() == before


def test_bad_configuration_is_reported():
    with pytest.raises(J.JudgeError, match=r"JudgeConnection.url must be null or an http\(s\) URL .*, got "
                                           r"'localhost:8000' \(config key judge.url\)"):
        J.JudgeConnection("m", "localhost:8000")
    with pytest.raises(J.JudgeError, match="--judge-url"):
        J.OpenAIBackend(J.JudgeConnection("m"))  # a local judge's connection
    backend = J.OpenAIBackend(J.JudgeConnection("m", "http://127.0.0.1:9/v1", api_key_env="SYNCLIB_UNSET_VAR"))
    with pytest.raises(J.JudgeError, match="constrained mode needs a local judge"):
        J.judge_items([make_item("valid")], backend, mode="constrained", progress=False)
    with pytest.raises(J.JudgeError, match="mode must be"):
        J.judge_items([make_item("valid")], backend, mode="free", progress=False)


@pytest.mark.parametrize("make, field", [
    (lambda: J.JudgeConnection(""), "JudgeConnection.model"),
    (lambda: J.JudgeConnection("m", "ftp://x"), "JudgeConnection.url"),
    (lambda: J.JudgeConnection("m", api_key_env=""), "JudgeConnection.api_key_env"),
    (lambda: J.JudgeConnection("m", max_retries=-1), "JudgeConnection.max_retries"),
    (lambda: J.JudgeConnection("m", backoff=-1.0), "JudgeConnection.backoff"),
    (lambda: J.JudgeSampling(temperature=-0.5), "JudgeSampling.temperature"),
    (lambda: J.JudgeSampling(seed=True), "JudgeSampling.seed"),
    (lambda: J.JudgeSampling(structured="yes"), "JudgeSampling.structured"),
    (lambda: J.JudgeSampling(reasoning_max_chars=2000), "JudgeSampling.reasoning_max_chars"),
    (lambda: J.JudgeOptions(J.JudgeConnection("m"), mode="free"), "JudgeOptions.mode"),
    (lambda: J.JudgeOptions(J.JudgeConnection("m", "http://h/v1"), mode="constrained"), "JudgeOptions.mode"),
    (lambda: J.JudgeOptions(J.JudgeConnection("m"), layout="wide"), "JudgeOptions.layout"),
    (lambda: J.JudgeOptions(J.JudgeConnection("m"), concurrency=0), "JudgeOptions.concurrency"),
    (lambda: J.JudgeOptions(J.JudgeConnection("m"), sample=2.5), "JudgeOptions.sample"),
    (lambda: J.JudgeOptions("m"), "JudgeOptions.connection"),
])
def test_judge_settings_are_checked_once_naming_the_field(make, field):
    with pytest.raises(J.JudgeError, match=re.escape(field)):
        make()


@pytest.mark.parametrize("make, message", [
    (lambda: J.JudgeConnection("m", timeout=0), "JudgeConnection.timeout must be a number > 0, got 0"),
    (lambda: J.JudgeConnection("m", max_retries=1.5), "JudgeConnection.max_retries must be an integer >= 0, got 1.5"),
    (lambda: J.JudgeSampling(seed=-1), "JudgeSampling.seed must be an integer >= 0, got -1"),
    (lambda: J.JudgeSampling(max_tokens=0), "JudgeSampling.max_tokens must be null or an integer >= 1, got 0"),
    (lambda: J.JudgeOptions(J.JudgeConnection("m"), batch_size=0), "JudgeOptions.batch_size must be an integer >= 1, "
                                                                    "got 0"),
])
def test_the_judges_timeout_retries_seed_length_and_batch_are_keys(make, message):
    """judge.timeout, max_retries, seed, max_tokens and batch_size: each field is checked by its
    key's rule, and the error names the field and the key; the key's default is the field's."""
    from synclib.keys import default

    key = "judge." + message.split(".", 1)[1].split(" ", 1)[0]
    with pytest.raises(J.JudgeError, match=re.escape(f"{message} (config key {key})")):
        make()
    assert J.JudgeOptions.from_config({"judge": {"model": "m", key.split(".")[1]: default(key)}}) == \
        J.JudgeOptions(J.JudgeConnection("m"))


def test_synclib_evaluate_reads_every_judge_key(monkeypatch, tmp_path):
    """Each judge.* key is an option of ``synclib evaluate`` with the key's default; the options
    become the JudgeOptions a run config with those values makes."""
    import argparse

    from synclib.cli import evaluate as cli, main
    from synclib.config import load_config
    from synclib.keys import KEYS, default

    p = argparse.ArgumentParser()
    cli.configure_parser(p)
    options = {a.dest: a for a in p._actions}
    for key in (k for k in KEYS if k.path.startswith("judge.")):
        name = key.path.split(".", 1)[1]
        dest = {"model": "judge_model", "url": "judge_url"}.get(name, name)
        assert dest in options, key.path
        assert key.required or name == "mode" or options[dest].default == default(key.path), key.path
    seen = []
    monkeypatch.setattr(cli, "evaluate_cube", lambda source, options, **_: seen.append(options))
    assert main(["evaluate", "c.nc", "--judge-model", "m", "--timeout", "5", "--max-retries", "0", "--seed", "3",
                 "--max-tokens", "100", "--batch-size", "4", "--no-progress"]) == 0
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text("results_dir: r\nscenarios: embedded\nmodels: {S: smollm2-135m}\npairs: [S-S]\n"
                        "judge: {model: m, timeout: 5, max_retries: 0, seed: 3, max_tokens: 100, batch_size: 4}\n")
    want = J.JudgeOptions.from_config(load_config(cfg_path))
    assert seen[0].connection == want.connection and seen[0].sampling == want.sampling
    assert (seen[0].batch_size, seen[0].judge_mode) == (want.batch_size, want.judge_mode) == (4, "constrained")
    assert main(["evaluate", "c.nc", "--judge-model", "m", "--max-tokens", "none", "--no-progress"]) == 0
    assert seen[1].sampling.max_tokens is None and seen[1].connection.timeout == default("judge.timeout")


def test_judge_options_from_a_run_config_and_overrides(monkeypatch):
    """One mapping from a run config to the judge's settings; the config's defaults are the
    settings' defaults; overrides (the command line's options) win; the key is read, never kept."""
    from synclib.config import KEYS, load_config

    cfg = load_config(overrides=["judge.model=fake-judge", "judge.url=http://127.0.0.1:9/v1", "judge.mode=json",
                                 "judge.sample=3", "judge.concurrency=2", "device=auto"])
    opts = J.JudgeOptions.from_config(cfg)
    assert opts.connection == J.JudgeConnection("fake-judge", "http://127.0.0.1:9/v1")
    assert opts.sampling == J.JudgeSampling()
    assert (opts.sample, opts.concurrency, opts.device, opts.judge_mode) == (3, 2, None, "json")
    assert opts.scenarios == cfg["scenarios"] and opts.layout == cfg["judge"]["layout"]
    # the config's defaults of the judge keys and the settings' own defaults agree
    default = J.JudgeOptions(J.JudgeConnection("x"))
    from synclib.judge.options import _config_fields

    assert {k.path for k in KEYS if k.path.startswith("judge.")} <= set(_config_fields())  # none is left out
    judge_keys = [k for k in KEYS if k.path.startswith("judge.") and not k.required]
    assert len(judge_keys) >= 8
    for key in judge_keys:
        name = key.path.split(".", 1)[1]
        holder = next(o for o in (default, default.connection, default.sampling) if hasattr(o, name))
        assert getattr(holder, name) == key.default, key.path
    local = J.JudgeOptions.from_config({"judge": {"model": "tiny"}, "device": "cpu"}, timeout=5,
                                       seed=2, batch_size=4, mode="constrained")
    assert local.connection.local and local.connection.timeout == 5 and local.sampling.seed == 2
    assert (local.batch_size, local.device, local.judge_mode) == (4, "cpu", "constrained")
    with pytest.raises(J.JudgeError, match="no judge setting 'colour'"):
        J.JudgeOptions.from_config(cfg, colour=1)
    with pytest.raises(J.JudgeError, match="judge model is missing"):
        J.JudgeOptions.from_config({})
    monkeypatch.setenv("SYNCLIB_TEST_KEY", SECRET)
    conn = J.JudgeConnection("m", "http://127.0.0.1:9/v1", api_key_env="SYNCLIB_TEST_KEY")
    backend = J.OpenAIBackend(conn)
    assert SECRET not in repr(conn) + repr(J.JudgeOptions(conn)) + repr(backend)
    backend.close()


# ------------------------------------------------------------------------------ local judge

@pytest.fixture(scope="module")
def tiny_judge(tiny_model_dir):
    """A tiny random Llama with the real SmolLM2 tokenizer, through synclib.models."""
    from synclib.models import load_model

    return load_model(tiny_model_dir)


def brute_force_logprob(loaded, prompt, cand):
    """log P(cand + <|im_end|> | prompt), one full forward pass, no cache, no batching."""
    import torch

    model, tok = loaded.model, loaded.tokenizer
    p = loaded.encode(prompt)
    joint = loaded.encode(prompt + cand)
    assert joint[: len(p)] == p
    ans = joint[len(p):] + [tok.convert_tokens_to_ids("<|im_end|>")]
    ids = torch.tensor([p + ans])
    with torch.no_grad():  # the last len(ans)+1 positions: len(p)-1 ... end
        logits = model(input_ids=ids, logits_to_keep=len(ans) + 1).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    return sum(float(logp[j, t]) for j, t in enumerate(ans))


def test_score_candidates_matches_full_forward(tiny_judge):
    tok = tiny_judge.tokenizer
    assert tok.convert_ids_to_tokens(_terminator_id(tok)) == "<|im_end|>"  # end of turn
    item = make_item("x", n=3)
    prompts = [tiny_judge.chat_prompt(J.constrained_question(item, a, d), system=J.SYSTEM_MESSAGE)
               for a, d in [(1, "goal"), (2, "secret"), (1, "relationship")]]
    cands = [[str(v) for v in range(*SCORE_RANGES[d])] + [str(SCORE_RANGES[d][1])]
             for d in ("goal", "secret", "relationship")]
    # multi-token candidates are present ("10", "-5", "-10")
    assert any(len(tok(c, add_special_tokens=False).input_ids) > 1 for cs in cands for c in cs)
    got = J.score_candidates(Engine(tiny_judge, max_rows=5), prompts, cands)
    for p, cs, lp in zip(prompts, cands, got):
        want = [brute_force_logprob(tiny_judge, p, c) for c in cs]
        np.testing.assert_allclose(lp, want, rtol=1e-4, atol=1e-4)


def test_local_constrained_judge_and_cache(tiny_judge, tmp_path):
    backend = J.LocalBackend(tiny_judge, batch_size=32)
    items = [make_item("a", 0, n=4), make_item("b", 1, n=3), make_item("c", 2, n=0)]
    cache = J.JudgeCache(tmp_path / "local.jsonl")
    table = J.judge_items(items, backend, mode="constrained", cache=cache, progress=False)
    assert backend.requests_sent == 2  # one batched scoring call per non-empty dialog
    assert (table["mode"] == "constrained").all() and (table.judge == tiny_judge.name).all()
    ok = table[table.episode < 2]
    assert ok.score.notna().all() and (ok.error == "").all()
    for d, (lo, hi) in SCORE_RANGES.items():
        t = ok[ok.dimension == d]
        assert t.score.between(lo, hi).all() and t.expected.between(lo, hi).all()
    empty = table[table.episode == 2]
    assert empty.score.isna().all() and (empty.error == "episode has no utterances").all()
    backend2 = J.LocalBackend(tiny_judge)
    table2 = J.judge_items(items, backend2, mode="constrained",
                           cache=J.JudgeCache(tmp_path / "local.jsonl"), progress=False)
    assert backend2.requests_sent == 0
    pd.testing.assert_frame_equal(table, table2)


def test_local_json_mode_records_failures(tiny_judge, tmp_path):
    """A random tiny model writes no valid JSON: one repair, then all missing with raw text."""
    backend = J.LocalBackend(tiny_judge, max_new_tokens=8)
    table = J.judge_items([make_item("a", 0, n=2)], backend, mode="json", progress=False)
    assert backend.requests_sent == 2
    assert table.score.isna().all() and (table["mode"] == "json").all()
    assert table.error.str.contains("after one repair").all()
    assert (table.raw.str.len() > 0).all()


# ------------------------------------------------------------------------------ cube input

def write_cube(path: Path, task_indices, n_utt):
    """A real netCDF file with the cube's text variables (schema: book/architecture.md)."""
    E, S, R = len(task_indices), n_utt.shape[1], 8
    text_a = np.full((E, S, R), "", dtype=object)
    text_b = np.full((E, S, R), "", dtype=object)
    for e in range(E):
        for s in range(S):
            for t in range(n_utt[e, s]):
                (text_a if t % 2 == 0 else text_b)[e, s, t // 2] = f"e{e} s{s} t{t}"
    ds = xr.Dataset(
        {"text_a": (("episode", "sim_seed", "round"), text_a),
         "text_b": (("episode", "sim_seed", "round"), text_b),
         "n_utterances": (("episode", "sim_seed"), n_utt.astype("int32"))},
        coords={"episode": np.arange(E), "sim_seed": np.arange(S),
                "task_index": ("episode", np.asarray(task_indices))})
    ds.to_netcdf(path, engine="netcdf4")
    return path


def test_items_from_cube_reconstructs_dialog_order(tmp_path, tasks_dir):
    from synclib.tasks.prompts import judge_intro
    from synclib.tasks.scenarios import load_tasks

    tasks = load_tasks(tasks_dir)
    n_utt = np.array([[5, 16], [0, 2]])
    cube = write_cube(tmp_path / "pair.nc", [7, 41], n_utt)
    items = J.items_from_cube(cube, tasks)
    assert [(i.episode, i.task_index, i.sim_seed) for i in items] == [
        (0, 7, 0), (0, 7, 1), (1, 41, 0), (1, 41, 1)]
    assert items[0].utterances == tuple(f"e0 s0 t{t}" for t in range(5))
    assert len(items[1].utterances) == 16 and items[2].utterances == ()
    assert items[0].intro == judge_intro(tasks[7])
    assert items[3].agent_names == tasks[41].names
    bad = write_cube(tmp_path / "bad.nc", [7, 99999], n_utt)
    with pytest.raises(J.JudgeError, match="task_index 99999"):
        J.items_from_cube(bad, tasks)


# ------------------------------------------------------------------------------ summaries

def test_overall_and_social_performance():
    rng = np.random.default_rng(0)
    rows = []
    for e in range(3):
        for s in range(2):
            for a in (1, 2):
                for d in DIMENSIONS:
                    lo, hi = SCORE_RANGES[d]
                    rows.append({"episode": e, "task_index": 10 + e, "sim_seed": s, "agent": a,
                                 "dimension": d, "score": int(rng.integers(lo, hi + 1))})
    table = pd.DataFrame(rows)
    table.loc[(table.episode == 1) & (table.sim_seed == 1) & (table.agent == 2)
              & (table.dimension == "goal"), "score"] = None
    table["score"] = table["score"].astype("Int64")
    ov = J.overall_scores(table)
    assert len(ov) == 12
    row = ov[(ov.episode == 0) & (ov.sim_seed == 0) & (ov.agent == 1)].iloc[0]
    assert row.overall == pytest.approx(
        table[(table.episode == 0) & (table.sim_seed == 0) & (table.agent == 1)].score.mean())
    gap = ov[(ov.episode == 1) & (ov.sim_seed == 1) & (ov.agent == 2)].iloc[0]
    assert np.isnan(gap.overall) and gap.n_scored == 6
    # the reference's order: a dialog counts when both agents are scored; seeds within an
    # episode, then episodes, then the two agents
    by_agent = []
    for a in (1, 2):
        per_ep = []
        for e in range(3):
            seeds = [s for s in (0, 1) if not (e == 1 and s == 1)]
            per_ep.append(np.mean([ov[(ov.episode == e) & (ov.sim_seed == s) & (ov.agent == a)].overall.item()
                                   for s in seeds]))
        by_agent.append(np.mean(per_ep))
    assert list(J.social_performance(table, by_agent=True)) == pytest.approx(by_agent)
    assert J.social_performance(table) == pytest.approx(np.mean(by_agent))
    # the reference's own arithmetic: sum of the 7 dimensions / 7
    sums = table.assign(v=table.score.astype(float)).groupby(["episode", "sim_seed", "agent"]).v.sum()
    assert row.overall == pytest.approx(sums[(0, 0, 1)] / 7)


def test_reading_scores_imports_no_judging_machinery():
    """The table module (what results.py and the notebooks read scores with) loads
    neither the HTTP client, torch, transformers nor the engine, in a fresh interpreter."""
    import subprocess
    import sys

    heavy = ["httpx", "torch", "transformers", "synclib.engine", "synclib.judge.backends"]
    code = ("import sys; import synclib.judge.table; from synclib.judge import read_table, "
            f"social_performance; print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ------------------------------------------------------------------------------ CLI

def test_cli_help_documents_every_option():
    import argparse

    from synclib.cli.evaluate import configure_parser

    p = argparse.ArgumentParser()
    configure_parser(p)
    for action in p._actions:
        if action.dest != "help":
            assert action.help, action.dest
    text = p.format_help()
    for opt in ("--scenarios", "--judge-url", "--judge-model", "--api-key-env", "--concurrency",
                "--timeout", "--mode", "--out", "--cache", "--no-structured",
                "--reasoning-max-chars"):
        assert opt in text


def test_cli_evaluate_against_http_judge(tmp_path, monkeypatch, capsys, tasks_dir):
    from synclib.cli import main

    monkeypatch.setenv("MY_JUDGE_KEY", SECRET)
    cube = write_cube(tmp_path / "pair.nc", [0, 1], np.array([[3, 2], [4, 0]]))
    with FakeJudgeServer(api_key=SECRET, default_case="valid") as server:
        rc = main(["evaluate", str(cube), "--scenarios", str(tasks_dir), "--judge-url",
                   server.url, "--judge-model", "fake-judge", "--api-key-env", "MY_JUDGE_KEY",
                   "--concurrency", "2", "--timeout", "5", "--no-progress"])
        assert rc == 0 and server.total_requests == 3
        assert all(server.response_formats) and server.format_problems == []  # structured
        prompt = server.bodies[0]["messages"][1]["content"]
    assert prompt.endswith((tasks_dir / "judge_instructions.txt").read_text().strip("\n"))
    assert prompt.startswith("Here is the context of this interaction:")
    out = tmp_path / "pair.judge.csv"
    table = J.read_table(out)
    assert len(table) == 4 * 14
    assert table[table.error == ""].shape[0] == 3 * 14  # the empty dialog is recorded missing
    assert (tmp_path / "pair.judge-cache.jsonl").exists()
    err = capsys.readouterr().err
    assert "social performance" in err and SECRET not in err
    assert SECRET not in out.read_text()


def test_cli_no_structured_and_refusal(tmp_path, capsys, tasks_dir):
    """--no-structured sends no response_format; the paper preset (reference layout, the
    paper's tuple-form instructions) against a server refusing the schema falls back."""
    from synclib.cli import main

    cube = write_cube(tmp_path / "pair.nc", [0, 1], np.array([[3, 2], [4, 0]]))
    common = [str(cube), "--scenarios", str(tasks_dir), "--judge-model", "fake-judge",
              "--api-key-env", "SYNCLIB_UNSET_VAR", "--timeout", "5", "--no-progress"]
    with FakeJudgeServer(default_case="valid") as server:
        rc = main(["evaluate", *common, "--judge-url", server.url, "--no-structured",
                   "--out", str(tmp_path / "plain.csv"), "--cache", str(tmp_path / "plain.jsonl")])
        assert rc == 0 and server.response_formats == [None] * 3
    assert "no structured output" in capsys.readouterr().err
    with FakeJudgeServer(default_case="valid", refuse_response_format=400) as server:
        rc = main(["evaluate", *common, "--judge-url", server.url, "--layout", "reference",
                   "--concurrency", "1", "--reasoning-max-chars", "300",
                   "--out", str(tmp_path / "ref.csv"), "--cache", str(tmp_path / "ref.jsonl")])
        assert rc == 0 and server.refusals == 1 and server.total_requests == 4
        assert json.dumps(server.response_formats[0]).count('"maxLength": 300') == 14
    err = capsys.readouterr().err
    assert "refused structured output" in err and "4 judge calls" in err
    table = J.read_table(tmp_path / "ref.csv")
    assert table[table.error == ""].shape[0] == 3 * 14


def test_cli_evaluate_with_local_judge(tmp_path, tiny_model_dir, capsys, tasks_dir):
    from synclib.cli import main

    cube = write_cube(tmp_path / "pair.nc", [3, 4], np.array([[2, 3], [1, 2]]))
    out = tmp_path / "scores.csv"
    rc = main(["evaluate", str(cube), "--scenarios", str(tasks_dir), "--judge-model",
               tiny_model_dir, "--sample", "2", "--out", str(out), "--no-progress"])
    assert rc == 0
    table = J.read_table(out)
    assert len(table) == 28 and (table["mode"] == "constrained").all()
    assert table.score.notna().all() and table.expected.notna().all()
    # a random sample of 2 of the 4 dialogs (episode x seed, cube order), default_rng(0)
    assert sorted(set(zip(table.episode, table.sim_seed))) == [(1, 0), (1, 1)]
    assert "constrained mode" in capsys.readouterr().err


# ------------------------------------------------------------------------------ embedded judge

@pytest.mark.slow
def test_embedded_smollm2_constrained_judge(tmp_path, tasks_dir):
    """The embedded SmolLM2-135M judges two episodes in constrained mode (the paper's Sotopia tasks
    where the suite has them, else embedded ones)."""
    from synclib.models import load_model
    from synclib.tasks.prompts import judge_intro
    from synclib.tasks.scenarios import load_tasks

    loaded = load_model("smollm2-135m")
    tasks = load_tasks(tasks_dir)
    items = []
    for e, ti in enumerate((0, 5)):
        t = tasks[ti]
        a, b = t.names
        utts = (f"Hi {b.split()[0]}, good to see you. Could we talk about something?",
                f"Of course, {a.split()[0]}. What is on your mind?",
                "I was hoping you could help me out; it matters a lot to me.",
                "I'll do what I can, but I need to think about my own situation too.")
        items.append(JudgeItem(e, ti, 0, judge_intro(t), t.names, utts))
    backend = J.LocalBackend(loaded, batch_size=16)
    t0 = time.perf_counter()
    table = J.judge_items(items, backend, mode="constrained",
                          cache=J.JudgeCache(tmp_path / "c.jsonl"), progress=False)
    elapsed = time.perf_counter() - t0
    assert len(table) == 28 and table.score.notna().all() and (table.error == "").all()
    for d, (lo, hi) in SCORE_RANGES.items():
        t = table[table.dimension == d]
        assert t.score.between(lo, hi).all() and t.expected.between(lo, hi).all()
    assert np.isfinite(J.social_performance(table))
    print(f"embedded constrained judge: {elapsed:.1f}s for 2 dialogs")


def test_score_candidates_with_a_sliding_window_model(tiny_judge):
    """A tiny Gemma-3 (sliding window of 16 tokens on one of its two layers) on prompts of
    hundreds of tokens: the cached, batched scores equal one full forward pass."""
    import dataclasses

    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from synclib.models import find_decoder_layers

    tok = tiny_judge.tokenizer
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=16,
                           layer_types=["sliding_attention", "full_attention"],
                           pad_token_id=tok.pad_token_id or 0)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).eval()
    layers = find_decoder_layers(model)
    loaded = dataclasses.replace(tiny_judge, model=model, decoder_layers=layers, n_layers=len(layers),
                                 d_model=cfg.hidden_size, model_type="gemma3_text")
    item = make_item("w", n=3)
    prompts = [tiny_judge.chat_prompt(J.constrained_question(item, a, d), system=J.SYSTEM_MESSAGE)
               for a, d in [(1, "goal"), (2, "believability")]]
    assert min(len(tiny_judge.encode(p)) for p in prompts) > 10 * cfg.sliding_window
    cands = [["0", "5", "10"], ["3", "7", "10"]]
    got = J.score_candidates(Engine(loaded, max_rows=2), prompts, cands)
    for p, cs, lp in zip(prompts, cands, got):
        np.testing.assert_allclose(lp, [brute_force_logprob(loaded, p, c) for c in cs], rtol=1e-4, atol=1e-4)


def test_sample_items_is_a_seeded_random_sample_in_cube_order():
    """judge.sample: n dialogs drawn without replacement with default_rng(seed), kept in the
    cube's order; None or n >= all keeps everything; a bad n is refused naming the setting."""
    from synclib.judge import JudgeError
    from synclib.judge.items import sample_items

    items = list(range(20))  # stand-ins: sample_items only indexes the list
    got = sample_items(items, 5, seed=3)
    want = sorted(np.random.default_rng(3).choice(20, size=5, replace=False).tolist())
    assert got == want and got == sorted(got)
    assert sample_items(items, 5, seed=3) == got and sample_items(items, 5, seed=4) != got
    assert sample_items(items, None) == items and sample_items(items, 20) == items
    for bad in (0, -1, 2.5, True):
        with pytest.raises(JudgeError, match="sample"):
            sample_items(items, bad)
