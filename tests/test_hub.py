"""synclib.run.hub: a run's hub ids checked on a real HTTP server that answers as the hub does.

huggingface_hub reads ``HF_ENDPOINT`` (and ``HF_HOME``, ``HF_HUB_OFFLINE``) when it is imported,
so every check runs in a fresh interpreter pointed at the fake hub, with its cache under
``tmp_path``; it prints the report as JSON.  Nothing is mocked: the fake hub is an
``http.server`` on 127.0.0.1 serving the endpoints huggingface_hub 2.4 requests
(``/api/models/{id}``, ``/api/models/{id}/auth-check``, ``/api/models?author=&search=&limit=``
and the agent-harness registry ``/api/agent-harnesses`` its headers read), with the hub's
status codes, ``X-Error-Code`` headers and JSON fields.  No test loads a model.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from synclib.run.hub import HubReport, ModelCheck, is_hub_id

REPO = Path(__file__).resolve().parents[1]
V03 = "mistralai/Mistral-7B-Instruct-v0.3"
TYPO = "mistralai/Mistral-7B-Instruct-v03"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
GRANTED, DENIED = "hf_fakeTokenGranted0123456789", "hf_fakeTokenDenied0123456789"

#: the fake hub's models: id -> how it answers model_info ("public", "gated": 200 with
#: gated "manual" as the hub answers for gated repos; "gated-403": 403 GatedRepo;
#: "private": 401 without an error code, unlisted; a granted token gets 200 for each)
MODELS = {
    "mistralai/Mistral-7B-Instruct-v0.1": "public",
    "mistralai/Mistral-7B-Instruct-v0.2": "public",
    V03: "public",
    "mistralai/Mistral-7B-v0.1": "public",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "public",
    "mistralai/Ministral-8B-Instruct-2410": "gated",
    "TheBloke/Mistral-7B-Instruct-v0.3-GGUF": "public",
    LLAMA: "gated",
    "meta-llama/Llama-3.2-3B-Instruct": "gated",
    "acme/locked-model": "gated-403",
    "acme/private-notes": "private",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "public",
}

CHECK = r"""
import json, sys, time
from dataclasses import asdict
from synclib.run.hub import check_models
a = json.loads(sys.argv[1])
t = time.perf_counter()
r = check_models(a["specs"], timeout=a["timeout"], offline=a["offline"])
print(json.dumps({"seconds": time.perf_counter() - t, "reachable": r.reachable, "reason": r.reason,
                  "endpoint": r.endpoint, "cache_dir": r.cache_dir, "checks": [asdict(c) for c in r.checks],
                  "lines": r.lines(), "error": r.error()}))
"""


# --------------------------------------------------------------------------- the fake hub
@dataclass
class FakeHub:
    """A hub on 127.0.0.1: ``requests`` records (path, query, authorised) of every GET;
    ``status`` set (e.g. 503) answers every request with it."""

    port: int = 0
    status: int | None = None
    requests: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self, prefix: str) -> list[str]:
        return [p for p, _, _ in self.requests if p.startswith(prefix)]


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body, headers: dict | None = None):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _not_found(self, authorised: bool):
            # the hub answers 401 to an anonymous request for a missing (or private) repo, 404 otherwise
            self._send(404 if authorised else 401, {"error": "Repository not found"},
                       {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})

        def do_GET(self):  # noqa: N802 - http.server's name
            url = urlsplit(self.path)
            path, query = unquote(url.path), parse_qs(url.query)
            auth = self.headers.get("Authorization", "")
            hub.requests.append((path, query, bool(auth)))
            if hub.status is not None:
                return self._send(hub.status, {"error": "Service Unavailable"})
            if path == "/api/agent-harnesses":
                return self._send(200, {"standardEnvVars": [], "harnesses": {}})
            if path == "/api/models":
                return self._list(query)
            if not path.startswith("/api/models/"):
                return self._send(404, {"error": "Sorry, we can't find the page you are looking for."})
            repo = path[len("/api/models/"):]
            if repo.endswith("/auth-check"):
                return self._auth_check(repo[:-len("/auth-check")], auth)
            kind = MODELS.get(repo)
            if kind is None or kind == "private" and auth != f"Bearer {GRANTED}":
                return self._not_found(bool(auth))
            if kind == "gated-403" and auth != f"Bearer {GRANTED}":
                return self._send(403, {"error": f"Access to model {repo} is restricted."},
                                  {"X-Error-Code": "GatedRepo",
                                   "X-Error-Message": f"Access to model {repo} is restricted and you are not "
                                                      "in the authorized list."})
            return self._send(200, _info(repo, kind))

        def _auth_check(self, repo: str, auth: str):
            kind = MODELS.get(repo)
            if kind is None:
                return self._not_found(bool(auth))
            if kind.startswith("gated") and auth != f"Bearer {GRANTED}":
                return self._send(403, {"error": "restricted"},
                                  {"X-Error-Code": "GatedRepo", "X-Error-Message": "not in the authorized list"})
            return self._send(200, {})

        def _list(self, query: dict):
            author = query.get("author", [""])[0].lower()
            search = query.get("search", [""])[0].lower()
            limit = int(query.get("limit", ["1000"])[0])
            ids = [m for m, kind in MODELS.items() if kind != "private"
                   and (not author or m.split("/")[0].lower() == author) and search in m.lower()]
            return self._send(200, [_info(m, MODELS[m], listed=True) for m in ids[:limit]])

    return Handler


def _info(repo: str, kind: str, listed: bool = False) -> dict:
    """The JSON fields the hub returns for a model (fewer in a listing)."""
    out = {"_id": f"{abs(hash(repo)):024x}"[:24], "id": repo, "modelId": repo, "likes": 3, "downloads": 100,
           "private": False, "tags": ["transformers"], "pipeline_tag": "text-generation",
           "library_name": "transformers", "createdAt": "2024-05-22T12:00:00.000Z"}
    if not listed:
        out |= {"author": repo.split("/")[0], "sha": "a" * 40, "lastModified": "2024-08-21T12:00:00.000Z",
                "gated": "manual" if kind.startswith("gated") else False, "disabled": False,
                "siblings": [{"rfilename": "config.json"}, {"rfilename": "model.safetensors"}]}
    return out


@pytest.fixture
def hub():
    state = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


class _SilentServer:
    """A TCP server that reads each request's first line and then closes the connection
    (``answer=False``: keeps it open, never answering)."""

    def __init__(self, answer: bool):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.lines, self.open, self.answer = self.sock.getsockname()[1], [], [], answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                self.lines.append(conn.recv(65536).split(b"\r\n", 1)[0].decode(errors="replace"))
            except OSError:
                pass
            if self.answer:
                conn.close()
            else:
                self.open.append(conn)

    def close(self):
        self.sock.close()
        for c in self.open:
            c.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_check(tmp_path: Path, endpoint: str, specs: list[str], *, timeout: float = 5.0,
              offline: bool | None = None, env: dict | None = None) -> tuple[dict, str]:
    """``check_models`` in a fresh interpreter against ``endpoint``: its JSON report and its
    whole output (stdout and stderr, to look for a token)."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("HF_", "HUGGINGFACE_")) and k != "TRANSFORMERS_OFFLINE" and "proxy" not in k.lower()}
    clean |= {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(REPO),
              "NO_PROXY": "127.0.0.1,localhost", **(env or {})}
    args = json.dumps({"specs": specs, "timeout": timeout, "offline": offline})
    out = subprocess.run([sys.executable, "-c", CHECK, args], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=clean)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stdout + out.stderr


def statuses(report: dict) -> dict:
    return {c["spec"]: c["status"] for c in report["checks"]}


def cache_model(tmp_path: Path, repo: str, weights: bool = True) -> Path:
    """Put ``repo`` in the hub cache under ``tmp_path/hf/hub`` as huggingface_hub lays it out:
    ``models--org--name/refs/main`` naming a snapshot that holds config.json (and weights)."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "hf" / "hub" / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / rev
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(rev)
    (snap / "config.json").write_text('{"model_type": "mistral"}')
    if weights:
        (snap / "model.safetensors").write_bytes(b"\0" * 16)
    return snap


# --------------------------------------------------------------------------- the tests
def test_is_hub_id_skips_embedded_names_local_paths_and_gguf_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "local").mkdir(parents=True)
    assert is_hub_id(V03) and is_hub_id("models/other") and is_hub_id("a.b_c-d/e.f_g-h")
    for spec in ("smollm2-135m", "gemma3-270m", "models/local", "weights/x.gguf", "org/Model.GGUF",
                 "a/b/c", "org/", "/org", "./x", "../x", "org/na me", "org/näme", "", "org\\name", 3, None):
        assert not is_hub_id(spec), spec


def test_importing_the_module_does_not_import_huggingface_hub():
    code = "import sys, synclib.run.hub; print('huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_known_gated_and_misspelt_ids_non_hub_specs_skipped(tmp_path, hub):
    (tmp_path / "models" / "local").mkdir(parents=True)
    specs = ["smollm2-135m", V03, TYPO, "models/local", LLAMA, "weights/x.gguf", V03, "gemma3-270m"]
    report, _ = run_check(tmp_path, hub.url, specs)
    assert report["reachable"] is True and report["reason"] == ""
    assert [(c["spec"], c["status"], c["nearest"]) for c in report["checks"]] == [
        (V03, "found", None), (TYPO, "unknown", V03), (LLAMA, "gated", None)]
    # one model_info request per id (the duplicate asked once, the non-hub specs never)
    assert hub.paths("/api/models/") == [f"/api/models/{V03}", f"/api/models/{TYPO}", f"/api/models/{LLAMA}"]
    # the nearest id came from the author's models whose name holds the name's first word
    listing = [q for p, q, _ in hub.requests if p == "/api/models"]
    assert listing and listing[0]["author"] == ["mistralai"] and listing[0]["search"] == ["Mistral"]
    assert report["lines"][0] == (f"models: 3 hub ids checked on {hub.url}: 1 found, "
                                  "1 gated (accept the licence, `hf auth login`), 1 not on the hub")
    assert f"  ERROR: {TYPO} is not on the hub (did you mean {V03}?)" in report["lines"]
    assert any(line.startswith(f"  {LLAMA} is gated: accept its licence at {hub.url}/{LLAMA}")
               for line in report["lines"])
    assert report["error"].startswith(f"1 model id not on the hub at {hub.url}: {TYPO} (did you mean {V03}?)")


def test_a_misspelt_author_is_matched_across_authors_and_nothing_close_is_none(tmp_path, hub):
    report, _ = run_check(tmp_path, hub.url, ["meta-lama/Llama-3.1-8B-Instruct", "acme/private-notes",
                                              "nobody/zzzz-qqqq"])
    checks = {c["spec"]: c for c in report["checks"]}
    assert checks["meta-lama/Llama-3.1-8B-Instruct"]["nearest"] == LLAMA
    # a private repository without a token: a 401 with no error code is "unknown", nothing close to it
    assert checks["acme/private-notes"]["status"] == "unknown" and checks["acme/private-notes"]["nearest"] is None
    assert checks["nobody/zzzz-qqqq"]["nearest"] is None
    assert "nobody/zzzz-qqqq (nothing similar found)" in report["error"]
    assert "meta-lama/Llama-3.1-8B-Instruct (did you mean meta-llama/Llama-3.1-8B-Instruct?)" in report["error"]


@pytest.mark.parametrize("token, llama", [(None, "gated"), (DENIED, "gated"), (GRANTED, "found")])
def test_gated_ids_and_a_saved_tokens_access(tmp_path, hub, token, llama):
    env = {"HF_TOKEN": token} if token else {}
    report, output = run_check(tmp_path, hub.url, [LLAMA, "acme/locked-model"], env=env)
    # model_info answers a gated repo (200, gated "manual"); a 403 GatedRepo is gated as well
    # (a token granted access is let through by model_info as well, then passes the auth check)
    assert statuses(report) == {LLAMA: llama, "acme/locked-model": llama}
    assert bool(hub.paths(f"/api/models/{LLAMA}/auth-check")) == bool(token)
    if token:
        assert all(authorised for p, _, authorised in hub.requests if p.startswith("/api/models/"))
        assert token not in output and token[3:] not in output
    if llama == "found":
        assert report["checks"][0]["detail"] == "gated; the saved token has access"


@pytest.mark.parametrize("how, timeout, said", [
    ("refused", 5.0, "could not connect"),
    ("closes", 5.0, "the connection broke"),
    ("hangs", 1.0, "no answer within 1 s"),
    ("503", 5.0, "HTTP 503"),
])
def test_a_hub_that_does_not_answer_is_asked_once_and_the_cache_looked_at(tmp_path, hub, how, timeout, said):
    ids = [V03, LLAMA, "mistralai/Mistral-7B-Instruct-v0.2", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    cache_model(tmp_path, LLAMA)
    server = None
    if how == "refused":
        endpoint = f"http://127.0.0.1:{_free_port()}"
    elif how == "503":
        hub.status, endpoint = 503, hub.url
    else:
        server = _SilentServer(answer=how == "closes")
        endpoint = f"http://127.0.0.1:{server.port}"
        # the agent-harness registry cached (as after any earlier run): its own 3 s fetch is not timed here
        (tmp_path / "hf" / ".agent_harnesses.json").write_text('{"standardEnvVars": [], "harnesses": {}}')
    try:
        report, _ = run_check(tmp_path, endpoint, ids, timeout=timeout)
    finally:
        if server is not None:
            server.close()
    assert report["reachable"] is False and report["reason"].startswith(said), report["reason"]
    assert statuses(report) == {V03: "not cached", LLAMA: "cached", ids[2]: "not cached", ids[3]: "not cached"}
    assert report["seconds"] < timeout * 1.5 + 0.5, report["seconds"]  # one timeout at most, not one per id
    asked = (hub.paths("/api/models/") if how == "503"
             else [line for line in server.lines if "/api/models/" in line] if server else None)
    if asked is not None:
        assert len(asked) == 1, asked
    assert report["lines"][0] == (f"models: the hub at {endpoint} did not answer ({report['reason']}): 4 ids not "
                                  f"checked; the local cache ({report['cache_dir']}) holds 1 of 4")
    assert sum(line.startswith("  WARNING:") for line in report["lines"]) == 3
    assert report["error"] is None


@pytest.mark.parametrize("offline, env", [(None, {"HF_HUB_OFFLINE": "1"}), (True, {"HF_HUB_OFFLINE": "0"}),
                                           (False, {"HF_HUB_OFFLINE": "1"})])
def test_offline_mode_reads_the_cache_and_never_asks_the_hub(tmp_path, hub, offline, env):
    cache_model(tmp_path, V03)
    cache_model(tmp_path, "mistralai/Mistral-7B-v0.1", weights=False)
    ids = [V03, "mistralai/Mistral-7B-v0.1", LLAMA]
    report, _ = run_check(tmp_path, hub.url, ids, offline=offline, env=env)
    assert hub.requests == []
    assert report["reachable"] is None and "HF_HUB_OFFLINE" in report["reason"]
    assert statuses(report) == {V03: "cached", "mistralai/Mistral-7B-v0.1": "not cached", LLAMA: "not cached"}
    assert report["checks"][1]["detail"] == "its config.json is in the local cache, its weights are not"
    assert report["cache_dir"] == str(tmp_path / "hf" / "hub")
    assert report["lines"][0].startswith("models: 3 hub ids not checked on the hub (")
    assert report["lines"][0].endswith(f"the local cache ({tmp_path / 'hf' / 'hub'}) holds 1 of 3")
    assert f"  WARNING: {LLAMA}: not in the local cache; download it where the hub answers " \
           f"(`hf download {LLAMA}`)" in report["lines"]


def test_a_run_without_hub_ids_asks_nothing(tmp_path, hub):
    report, _ = run_check(tmp_path, hub.url, ["smollm2-135m", "gemma3-270m", "x.gguf"])
    assert report["checks"] == [] and report["lines"] == [] and report["error"] is None
    assert hub.requests == []


def test_the_report_names_every_unknown_id():
    report = HubReport([ModelCheck("a/b", "found"), ModelCheck("a/c", "unknown", nearest="a/cc"),
                        ModelCheck("x/y", "unknown")], reachable=True, endpoint="https://hub.example")
    assert [c.spec for c in report.unknown] == ["a/c", "x/y"]
    assert report.error() == ("2 model ids not on the hub at https://hub.example: a/c (did you mean a/cc?); "
                              "x/y (nothing similar found). Correct the run config's models (a private "
                              "repository needs `hf auth login`).")
    assert HubReport([ModelCheck("a/b", "gated")], reachable=True).error() is None


def test_the_dry_run_and_the_run_refuse_a_misspelt_id_before_anything_starts(tmp_path, hub):
    """`synclib run` on a config whose Mistral id is misspelt: the dry run and the real run both
    exit 2 naming the nearest id the hub knows, and nothing is written; spelt right, the dry run
    prices the grid."""
    import yaml

    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cfg["models"] = {"M3": {**cfg["models"]["M3"], "spec": TYPO}, "L": {**cfg["models"]["L3.2"]}}
    cfg["pairs"], cfg["results_dir"] = ["M3-L"], str(tmp_path / "r")
    cfg["notebooks"]["ability_scores"] = str(REPO / "data" / "ability_scores.csv")
    conf = tmp_path / "typo.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(REPO),
            "NO_PROXY": "127.0.0.1,localhost", "HF_HUB_DISABLE_TELEMETRY": "1"}
    for extra in (["--dry-run"], ["--steps", "simulate"]):
        out = subprocess.run([sys.executable, "-m", "synclib", "run", "--config", str(conf), *extra],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"not on the hub at {hub.url}: {TYPO} (did you mean {V03}?)" in out.stderr
        assert "Nothing was started." in out.stderr and not (tmp_path / "r").exists()
    conf.write_text(conf.read_text().replace(TYPO, V03))
    out = subprocess.run([sys.executable, "-m", "synclib", "run", "--config", str(conf), "--dry-run"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "models: 2 hub ids checked on" in out.stdout and "GPU-hours on" in out.stdout
