"""synclib.tasks.datasets: the paper's tasks fetched into a cache, checked against recorded hashes.

Downloads go to a real HTTP server on 127.0.0.1 serving files of our own (good, truncated,
changed, missing, server down), never to the internet; ``--from`` takes folders and
archives.  The one test of the real Sotopia files uses the suite's ``sotopia_dir``.
"""
from __future__ import annotations

import functools
import hashlib
import http.server
import shutil
import socket
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from synclib import cli
from synclib.tasks import datasets
from synclib.tasks.datasets import Dataset, DatasetError

FILES = {"envs.json": b'{"e1": {"scenario": "a quiet library"}}\n',
         "agents.json": b'{"p1": {"first_name": "Ada"}}\n',
         "notes.txt": b"rate both agents\n" * 40}


def _dataset(url: str = "http://127.0.0.1:9/") -> Dataset:
    return Dataset(name="toy", base_url=url,
                   files={n: (f"data/{n}", hashlib.sha256(b).hexdigest()) for n, b in FILES.items()},
                   url_env="SYNCLIB_TOY_URL", about="Toy files written for synclib's tests (licence: ours).")


class Server:
    """A static file server on 127.0.0.1 over ``root`` (http.server), in a thread."""

    def __init__(self, root: Path):
        handler = functools.partial(_Quiet, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args):  # keep the test output clean; remember the paths asked for
        _Quiet.requests.append(self.path)


def _serve_dir(tmp_path: Path, files: dict[str, bytes]) -> Path:
    root = tmp_path / "www"
    (root / "data").mkdir(parents=True)
    for n, b in files.items():
        (root / "data" / n).write_bytes(b)
    return root


def test_download_checks_hashes_and_caches(tmp_path):
    ds = _dataset()
    cache = tmp_path / "cache"
    with Server(_serve_dir(tmp_path, FILES)) as srv:
        notes = []
        root = datasets.path(ds, cache=cache, url=srv.url, log=notes.append)
        assert root == cache / "toy" and sorted(p.name for p in root.iterdir()) == sorted(FILES)
        assert all((root / n).read_bytes() == b for n, b in FILES.items())
        assert len(notes) == 1 and "licence: ours" in notes[0] and str(root) in notes[0]
        # a second use reads the cache: no request, no notice
        _Quiet.requests.clear()
        assert datasets.path(ds, cache=cache, url=srv.url, log=notes.append) == root
        assert _Quiet.requests == [] and len(notes) == 1
        # a cached file changed by hand is fetched again; the others are not
        (root / "notes.txt").write_bytes(b"edited")
        assert datasets.status(ds, cache) == {"envs.json": "ok", "agents.json": "ok", "notes.txt": "changed"}
        datasets.path(ds, cache=cache, url=srv.url, log=notes.append)
        assert _Quiet.requests == ["/data/notes.txt"] and datasets.is_cached(ds, cache)


@pytest.mark.parametrize("case", ["truncated", "changed", "404"])
def test_bad_downloads_are_refused_naming_the_file(tmp_path, case):
    ds = _dataset()
    served = dict(FILES)
    if case == "truncated":
        served["notes.txt"] = FILES["notes.txt"][:100]
    elif case == "changed":
        served["notes.txt"] = FILES["notes.txt"].replace(b"both", b"each")
    else:
        del served["notes.txt"]
    cache = tmp_path / "cache"
    with Server(_serve_dir(tmp_path, served)) as srv:
        with pytest.raises(DatasetError, match="notes.txt") as err:
            datasets.path(ds, cache=cache, url=srv.url, log=lambda m: None)
    msg = str(err.value)
    if case == "404":
        assert "could not download" in msg and "404" in msg and "--from" in msg
    else:
        assert "not the recorded one" in msg and ds.files["notes.txt"][1] in msg
    assert not (cache / "toy" / "notes.txt").exists()  # nothing unchecked is kept
    assert datasets.status(ds, cache)["notes.txt"] == "missing"


def test_server_down_says_how_to_fetch_offline(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ds = _dataset(f"http://127.0.0.1:{port}/")
    with pytest.raises(DatasetError) as err:
        datasets.path(ds, cache=tmp_path, log=lambda m: None)
    msg = str(err.value)
    assert "could not download" in msg and "ConnectionError" in msg and "synclib fetch toy --from" in msg
    # without download: the same advice, and nothing is attempted
    with pytest.raises(DatasetError, match="missing or changed: envs.json, agents.json, notes.txt"):
        datasets.path(ds, download=False, cache=tmp_path)


def test_mirror_variable_and_cache_variable(tmp_path, monkeypatch):
    ds = _dataset("http://127.0.0.1:9/")  # the pinned source is down; the mirror serves
    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path / "c"))
    with Server(_serve_dir(tmp_path, FILES)) as srv:
        monkeypatch.setenv(ds.url_env, srv.url.rstrip("/"))
        assert ds.url() == srv.url
        assert datasets.path(ds, log=lambda m: None) == tmp_path / "c" / "toy"


@pytest.mark.parametrize("kind", ["folder", "zip", "tar.gz"])
def test_from_a_folder_or_archive(tmp_path, kind):
    ds = _dataset()
    src = tmp_path / "brought" / "deep"
    src.mkdir(parents=True)
    for n, b in FILES.items():
        (src / n).write_bytes(b)
    if kind == "zip":
        arc = tmp_path / "brought.zip"
        with zipfile.ZipFile(arc, "w") as z:
            for n in FILES:
                z.write(src / n, f"sotopia_utils/data/{n}")
        src = arc
    elif kind == "tar.gz":
        arc = tmp_path / "brought.tar.gz"
        with tarfile.open(arc, "w:gz") as t:
            for n in FILES:
                t.add(src / n, f"x/{n}")
        src = arc
    else:
        src = tmp_path / "brought"  # files found below the folder named
    notes = []
    root = datasets.fetch(ds, src, cache=tmp_path / "cache", log=notes.append)
    assert datasets.is_cached(ds, tmp_path / "cache") and root == tmp_path / "cache" / "toy"
    assert "licence: ours" in notes[0]


def test_from_refuses_changed_truncated_or_missing_files_and_changes_nothing(tmp_path):
    ds = _dataset()
    src = tmp_path / "brought"
    src.mkdir()
    for n, b in FILES.items():
        (src / n).write_bytes(b)
    cache = tmp_path / "cache"
    (src / "agents.json").write_bytes(FILES["agents.json"][:-5])
    with pytest.raises(DatasetError, match=r"agents\.json: not the recorded toy file .*changed or truncated"):
        datasets.fetch(ds, src, cache=cache, log=lambda m: None)
    assert not (cache / "toy").exists()  # checked before anything is copied
    (src / "agents.json").unlink()
    with pytest.raises(DatasetError, match=r"agents\.json not found in it"):
        datasets.fetch(ds, src, cache=cache, log=lambda m: None)
    with pytest.raises(DatasetError, match="no such file or folder"):
        datasets.fetch(ds, tmp_path / "nope", cache=cache)
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(DatasetError, match="neither a folder nor a zip or tar archive"):
        datasets.fetch(ds, tmp_path / "plain.txt", cache=cache)


def test_sotopia_registry_matches_the_papers_files(sotopia_dir, tmp_path, monkeypatch, capsys):
    """The recorded hashes are those of the paper's task files; `synclib fetch sotopia --from`
    fills the cache and `scenarios: sotopia` then loads the 450 tasks and the paper's judge
    instructions from it."""
    from synclib.judge.prompt import load_instructions
    from synclib.tasks.scenarios import load_tasks

    for name, (_, digest) in datasets.SOTOPIA.files.items():
        assert datasets.sha256(sotopia_dir / name) == digest, name
    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(datasets.SOTOPIA.url_env, "http://127.0.0.1:9/")  # no download may happen
    assert cli.main(["fetch", "sotopia", "--from", str(sotopia_dir)]) == 0
    out = capsys.readouterr().out
    assert "ImpACT" in out and "49fe97e" in out and "scenarios: sotopia" in out
    tasks = load_tasks("sotopia")
    assert len(tasks) == 450 == datasets.SOTOPIA.n_tasks and tasks.root == tmp_path / "sotopia"
    text, src = load_instructions("sotopia")
    assert text == (sotopia_dir / "judge_instructions.txt").read_text(encoding="utf-8")
    # a changed copy is refused, naming it
    bad = tmp_path / "bad"
    shutil.copytree(sotopia_dir, bad)
    (bad / "envs.json").write_bytes((bad / "envs.json").read_bytes()[:1000])
    assert cli.main(["fetch", "sotopia", "--from", str(bad)]) == 2
    assert "envs.json: not the recorded sotopia file" in capsys.readouterr().err


def test_sotopia_pinned_source():
    assert datasets.SOTOPIA_COMMIT == "49fe97e1e22b18061cae49aec14aba69a9ec0e8c"
    assert datasets.SOTOPIA.base_url == (
        "https://raw.githubusercontent.com/zzn-nzz/LM_neural_synchrony/"
        "49fe97e1e22b18061cae49aec14aba69a9ec0e8c/sotopia_utils/")
    assert {r for r, _ in datasets.SOTOPIA.files.values()} == {
        "sotopia_data/envs.json", "sotopia_data/agents.json", "sotopia_data/env_agent_combos.json",
        "output_schema.txt"}
