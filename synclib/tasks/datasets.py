"""Datasets fetched on first use, never shipped: a pinned source, a SHA-256 recorded here for every file, and a
per-user cache filled by `pooch <https://www.fatiando.org/pooch/>`_.  ``synclib fetch NAME`` fills it ahead of a
run, from the pinned URL or, offline, from a folder or archive the user brought (``--from``).

``sotopia`` (:data:`SOTOPIA`, a task set: ``scenarios: sotopia``)
    Sotopia's tasks (Zhou et al., 2023) as the paper's reference repository distributes them; Sotopia's licence.
``sotopia-human`` (:data:`SOTOPIA_HUMAN`, for table 4 and figure 10)
    Sotopia-π's human ratings (Wang et al., 2024; Apache-2.0) and GPT-4's scores of the GPT-4 episodes from
    Sotopia's repository (MIT), rewritten by :func:`synclib.judge.sotopia_human.prepare`.

``SYNCLIB_DATA`` moves the cache (default e.g. ``~/.cache/synclib``; one sub-folder per dataset); a dataset's
``url_env`` (``SYNCLIB_SOTOPIA_URL``) names a mirror (same names under one base URL, same hashes).
"""
from __future__ import annotations

import hashlib
import os
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

#: the cache folder's environment variable
CACHE_ENV = "SYNCLIB_DATA"


class DatasetError(ValueError):
    """A dataset file is missing, cannot be fetched, or differs from its recorded hash (the message names the
    file and says how to get it)."""


@dataclass(frozen=True)
class Dataset:
    """A set of files fetched from one pinned source.

    Parameters
    ----------
    name : the dataset's name and cache sub-folder.
    base_url : the pinned source.
    files : ``{local name: (remote path relative to base_url, or a whole URL; sha256 hex digest)}``.
    url_env : environment variable naming a mirror, which serves every file under its local name.
    about : what the files are, their source and licence (printed on first use and by ``synclib fetch``).
    kind : ``"tasks"`` (a task set, ``scenarios: NAME``) or ``"ratings"``.
    prepare : optional ``"module:function"`` called with the cache folder once every file is checked.
    n_tasks : the tasks a task set holds (counted by a dry run before the files are fetched).
    """

    name: str
    base_url: str
    files: Mapping[str, tuple[str, str]]
    url_env: str
    about: str
    kind: str = "tasks"
    prepare: str | None = None
    n_tasks: int | None = None

    def url(self, override: str | None = None) -> str:
        """The base URL in use: ``override``, else the mirror variable, else the pinned one."""
        base = override or os.environ.get(self.url_env) or self.base_url
        return base if base.endswith("/") else base + "/"

    def file_url(self, name: str, override: str | None = None) -> str:
        """Where file ``name`` is downloaded from: a mirror's ``BASE/remote`` (``BASE/name`` for a whole-URL
        file), else the pinned source."""
        remote = self.files[name][0]
        mirror = override or os.environ.get(self.url_env)
        if "://" in remote:
            return self.url(mirror) + name if mirror else remote
        return self.url(mirror) + remote


#: the paper's reference repository at the commit whose tasks the paper used
SOTOPIA_COMMIT = "49fe97e1e22b18061cae49aec14aba69a9ec0e8c"
SOTOPIA = Dataset(
    name="sotopia",
    base_url=f"https://raw.githubusercontent.com/zzn-nzz/LM_neural_synchrony/{SOTOPIA_COMMIT}/sotopia_utils/",
    files={
        "envs.json": ("sotopia_data/envs.json",
                      "4b2ae05caee05e10759d2f763f347211d48e06dce9450f43c43f38f129cffe8c"),
        "agents.json": ("sotopia_data/agents.json",
                        "9eed1272a9a0ebd0276465a20e4db3264321d6a308d99d99e4f9246a91f118cc"),
        "env_agent_combos.json": ("sotopia_data/env_agent_combos.json",
                                  "a539ede1878298d78bbb546aa3c30d6a4289572b5bdadbecd93c90f46eea6f12"),
        "judge_instructions.txt": ("output_schema.txt",
                                   "adff65c2799e92d5f31ee1045b124d0b720822d696d50710807930468d79b67e"),
    },
    url_env="SYNCLIB_SOTOPIA_URL",
    about=("The Sotopia tasks the paper used (Zhou et al., 2023, 'SOTOPIA: Interactive Evaluation for Social "
           "Intelligence in Language Agents'): 90 scenarios, 40 personas, 450 tasks, and the judge's format "
           "instructions, from the paper's reference repository github.com/zzn-nzz/LM_neural_synchrony at commit "
           f"{SOTOPIA_COMMIT[:7]}. Their licence is Sotopia's, not synclib's (Sotopia's dataset card names AI2's "
           "ImpACT licence; the reference repository states none): read it before you redistribute them. "
           "synclib keeps them in your cache and never copies them into its repository."),
    n_tasks=450,
)

#: Sotopia-π's repository at its last commit holding the human ratings (they were removed after it)
SOTOPIA_PI_COMMIT = "47d3e140d0bd4ab33d7a480c22f718a67cc477f8"
#: Sotopia's repository at the commit (of its pull request 31) holding GPT-4's scores of the rated episodes
SOTOPIA_SCORES_COMMIT = "b72bd754cfda8546bc64fb3be4b882a95966312c"
SOTOPIA_HUMAN = Dataset(
    name="sotopia-human",
    base_url=f"https://raw.githubusercontent.com/sotopia-lab/sotopia-pi/{SOTOPIA_PI_COMMIT}/human_eval/",
    files={
        "gpt4_final.csv": ("gpt4_final.csv", "687f1ff461882272104e69a9263f3b4ded27d2caf939914210232ea8a00bdce2"),
        "gpt3.5_final.csv": ("gpt3.5_final.csv",
                             "74b352b55339c4a84dc573d95fc51c8aac82eaeb57509a98d8fa821b766f7a90"),
        "mistral-instruct_final.csv": ("mistral-instruct_final.csv",
                                       "88e8499a5abcd7b3ca71b2fe2c0788261eb704178639a7e463afd4eb90e76f8b"),
        "BC_final.csv": ("BC_final.csv", "8d332ef23d49828790e5d1b4eed4f05a1ffff1f0c87d5a9a95322481b0cbd26f"),
        "SR_final.csv": ("SR_final.csv", "634ba7b556c851ae47ac3ac5c69c9a11556cf5b9e3baae3aee9f75fe6f727f92"),
        "BC+SR_final.csv": ("BC%2BSR_final.csv", "9aac94387ccc68a5172a63842aa6688840eee4bcb76e6ea41c7dc5c5da7c411c"),
        "complete_gpt_score.json": (
            f"https://raw.githubusercontent.com/sotopia-lab/sotopia/{SOTOPIA_SCORES_COMMIT}/human_eval/"
            "complete_gpt_score.json", "7bc64629963d38ca322c2e96884e5efc63fdcafc48977228d9e66891d5a899eb"),
    },
    url_env="SYNCLIB_SOTOPIA_HUMAN_URL",
    about=("Human Sotopia-eval ratings published with Sotopia-π (Wang et al., 2024, 'SOTOPIA-π: Interactive "
           "Learning of Socially Intelligent Language Agents'): 154 episodes of the SOTOPIA-hard tasks played "
           "by six kinds of agents, each rated by two annotators on Prolific, from github.com/sotopia-lab/"
           f"sotopia-pi at commit {SOTOPIA_PI_COMMIT[:7]} (Apache-2.0); and GPT-4's Sotopia-eval scores of "
           "the GPT-4 episodes among them, from github.com/sotopia-lab/sotopia at commit "
           f"{SOTOPIA_SCORES_COMMIT[:7]} (MIT). These are not the annotations of the Sotopia paper (Zhou et "
           "al., 2023) that the paper's appendix H used: those were never published as files. synclib keeps "
           "them in your cache, never in its repository, and stores the annotators' ids only as hashes."),
    kind="ratings",
    prepare="synclib.judge.sotopia_human:prepare",
)

#: every dataset by name (``synclib fetch NAME``)
DATASETS = {SOTOPIA.name: SOTOPIA, SOTOPIA_HUMAN.name: SOTOPIA_HUMAN}
#: the datasets that are task sets (``scenarios: NAME``)
TASK_SETS = {n: d for n, d in DATASETS.items() if d.kind == "tasks"}


def cache_dir(dataset: Dataset = SOTOPIA, cache: str | os.PathLike | None = None) -> Path:
    """``cache``, else ``$SYNCLIB_DATA``, else ``pooch.os_cache('synclib')``, with the dataset's name appended."""
    if cache is None and os.environ.get(CACHE_ENV):
        cache = os.environ[CACHE_ENV]
    if cache is None:
        import pooch

        cache = pooch.os_cache("synclib")
    return Path(cache).expanduser() / dataset.name


def sha256(path: str | os.PathLike) -> str:
    """The SHA-256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def status(dataset: Dataset = SOTOPIA, cache: str | os.PathLike | None = None) -> dict[str, str]:
    """``{file: "ok" | "missing" | "changed"}`` for the cached copy (no network)."""
    root = cache_dir(dataset, cache)
    out = {}
    for name, (_, digest) in dataset.files.items():
        f = root / name
        out[name] = "missing" if not f.is_file() else "ok" if sha256(f) == digest else "changed"
    return out


def is_cached(dataset: Dataset = SOTOPIA, cache: str | os.PathLike | None = None) -> bool:
    """Whether every file of ``dataset`` is in the cache with its recorded hash."""
    return all(v == "ok" for v in status(dataset, cache).values())


def how_to_fetch(dataset: Dataset = SOTOPIA) -> str:
    """What a user types to fill the cache, online or offline."""
    return (f"`synclib fetch {dataset.name}` downloads them ({dataset.url()}); on a machine without "
            f"internet, `synclib fetch {dataset.name} --from DIR_OR_ARCHIVE` takes a folder or archive you "
            f"brought ({', '.join(dataset.files)}), checked against the same hashes; ${CACHE_ENV} moves the cache")


def path(dataset: Dataset = SOTOPIA, download: bool = True, cache: str | os.PathLike | None = None,
         url: str | None = None, log: Callable[[str], None] | None = None) -> Path:
    """The folder holding ``dataset``'s files, checked against their hashes.

    Parameters
    ----------
    download : fetch missing or changed files (else raise).
    cache : the cache root (default :func:`cache_dir`'s).
    url : a mirror's base URL (default the ``url_env`` variable, else the pinned one).
    log : where the first use's notice goes (default: standard error).

    Raises
    ------
    DatasetError
        A file is missing and not ``download``, cannot be downloaded, or differs from its recorded hash.
    """
    root = cache_dir(dataset, cache)
    todo = [f for f, s in status(dataset, cache).items() if s != "ok"]
    if not todo:
        _prepare(dataset, root, log)
        return root
    if not download:
        raise DatasetError(f"the {dataset.name} files are not in {root} (missing or changed: {', '.join(todo)}); "
                           + how_to_fetch(dataset) + ".")
    import pooch
    import requests

    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    say(f"[synclib] fetching {dataset.name} into {root}. {dataset.about}")
    root.mkdir(parents=True, exist_ok=True)
    for name in todo:
        digest, where = dataset.files[name][1], dataset.file_url(name, url)
        try:
            pooch.retrieve(where, known_hash=f"sha256:{digest}", fname=name, path=root, progressbar=False)
        except requests.exceptions.RequestException as exc:
            raise DatasetError(f"{name}: could not download {where} ({type(exc).__name__}: {exc}); "
                               + how_to_fetch(dataset) + ".") from None
        except ValueError as exc:  # pooch: the download's hash differs from the recorded one
            raise DatasetError(f"{name}: the file downloaded from {where} is not the recorded one "
                               f"(SHA-256 expected {digest}); it was not kept. {exc}") from None
    _prepare(dataset, root, say)
    return root


def _prepare(dataset: Dataset, root: Path, log=None) -> None:
    """Run the dataset's ``prepare`` step on its checked cache folder."""
    if dataset.prepare:
        import importlib

        module, func = dataset.prepare.split(":")
        getattr(importlib.import_module(module), func)(root, log=log or (lambda m: print(m, file=sys.stderr)))


def _members(source: Path, names) -> dict[str, bytes | Path]:
    """The dataset's files found in a folder (at any depth) or an archive, by file name."""
    found: dict[str, bytes | Path] = {}
    if source.is_dir():
        for name in names:
            hits = sorted(source.rglob(name), key=lambda p: len(p.parts))
            if hits:
                found[name] = hits[0]
        return found
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as z:
            for info in sorted(z.infolist(), key=lambda i: i.filename.count("/")):
                base = info.filename.rsplit("/", 1)[-1]
                if base in names and base not in found and not info.is_dir():
                    found[base] = z.read(info)
        return found
    if tarfile.is_tarfile(source):
        with tarfile.open(source) as t:
            for m in sorted(t.getmembers(), key=lambda m: m.name.count("/")):
                base = m.name.rsplit("/", 1)[-1]
                if base in names and base not in found and m.isfile():
                    found[base] = t.extractfile(m).read()  # read as bytes: nothing is extracted
        return found
    raise DatasetError(f"--from {source}: neither a folder nor a zip or tar archive")


def fetch(dataset: Dataset = SOTOPIA, source: str | os.PathLike | None = None,
          cache: str | os.PathLike | None = None, url: str | None = None,
          log: Callable[[str], None] | None = None) -> Path:
    """Fill the cache and return its folder: download (``source`` None) or copy from a folder or archive, all
    files checked against their SHA-256 before any is copied.  Raises :class:`DatasetError` for a file missing
    from ``source`` or differing from its hash, or a failed download."""
    if source is None:
        return path(dataset, download=True, cache=cache, url=url, log=log)
    src = Path(source).expanduser()
    if not src.exists():
        raise DatasetError(f"--from {src}: no such file or folder")
    found = _members(src, dataset.files)
    missing = [n for n in dataset.files if n not in found]
    if missing:
        raise DatasetError(f"--from {src}: {', '.join(missing)} not found in it (expected "
                           f"{', '.join(dataset.files)})")
    data = {n: (v.read_bytes() if isinstance(v, Path) else v) for n, v in found.items()}
    for name, blob in data.items():
        digest = dataset.files[name][1]
        got = hashlib.sha256(blob).hexdigest()
        if got != digest:
            where = found[name] if isinstance(found[name], Path) else f"{src}:{name}"
            raise DatasetError(f"{where}: not the recorded {dataset.name} file (SHA-256 {got}, expected {digest}; "
                               f"{len(blob):,} bytes): changed or truncated, refused")
    root = cache_dir(dataset, cache)
    root.mkdir(parents=True, exist_ok=True)
    for name, blob in data.items():
        tmp = root / f".{name}.part"
        tmp.write_bytes(blob)
        os.replace(tmp, root / name)
    _prepare(dataset, root, log)
    (log or (lambda m: print(m, file=sys.stderr, flush=True)))(
        f"[synclib] {dataset.name}: {len(data)} files from {src} checked and cached in {root}. {dataset.about}")
    return root
