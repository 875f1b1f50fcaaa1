"""synclib.memory: the session budget, its sharing between engines, and freed memory going back."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from synclib.engine import Engine
from synclib.memory import GiB, CacheBudget, available_bytes, session_budget
from synclib.models import load_model


def test_session_budget_is_a_quarter_of_what_is_available_within_bounds():
    assert session_budget("auto", available=8 * GiB) == 2 * GiB
    assert session_budget("auto", available=512 << 20) == 256 << 20      # the floor
    assert session_budget("auto", available=64 * GiB) == 4 * GiB         # the cap
    assert session_budget(1.5) == int(1.5 * GiB) and session_budget(0) == 0
    assert available_bytes() is None or available_bytes() > 0
    for bad in (-1, "lots", True, None):
        with pytest.raises(ValueError, match="cache_gib must be 'auto' or a number >= 0"):
            session_budget(bad)


def test_engines_sharing_a_budget_draw_on_the_same_bytes(tiny_model_dir):
    """A model pair's two engines hold at most the shared budget together; forgetting a
    session in one makes room for the other's."""
    lm = load_model(tiny_model_dir)
    prompt = "Hello there, how are you today? " * 8
    one = Engine(lm, max_cache_bytes=10 * GiB)
    one.read_states([prompt], sessions=["probe"])
    size = one.budget.used
    assert size > 0 and one.budget.peak == size
    budget = CacheBudget(int(1.5 * size))
    a, b = Engine(lm, max_cache_bytes=budget), Engine(lm, max_cache_bytes=budget)
    a.read_states([prompt], sessions=["x"])
    b.read_states([prompt], sessions=["y"])
    assert (a.cached_sessions, b.cached_sessions, b.stats["cache_skips"]) == (1, 0, 1)
    assert budget.used == size and a.max_cache_bytes == b.max_cache_bytes == budget.limit
    a.forget("x")
    assert budget.used == 0
    b.read_states([prompt + " Fine."], sessions=["y"])
    assert b.cached_sessions == 1 and budget.used > size and b.stats["recomputed_tokens"] > 0
    b.clear()
    assert budget.used == 0 and budget.peak > size


FRAGMENT = """
import numpy as np, resource, sys
from synclib.memory import return_freed_memory
if sys.argv[1] == "on":
    assert return_freed_memory()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
base = rss()
keep = []
for turn in range(6):                       # caches of growing sizes, a small survivor between them
    big = [np.ones(1_000_000 + turn * 40_000 + i * 8_000) for i in range(40)]   # ~8-10 MB each
    keep.append([np.ones(100) for _ in range(200)])
    del big
print((rss() - base) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_go_back_to_the_system():
    """Blocks of cache size that a loop frees leave the resident memory once
    return_freed_memory is set (glibc would otherwise keep up to 32 MiB blocks in its heap)."""
    grown = {m: float(subprocess.run([sys.executable, "-c", FRAGMENT, m], capture_output=True, text=True,
                                     check=True).stdout) for m in ("off", "on")}
    assert grown["on"] < 50, grown          # MiB left resident after freeing ~400 MB


TRIM = """
import numpy as np
from synclib.memory import return_freed_memory, release_free_memory
return_freed_memory()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
blocks = [np.ones(25_000 + i % 7) for i in range(2_000)]     # ~200 KB each: served from the heap
keep = blocks[::50]                                             # a few survivors pin the heap's top
del blocks
before = rss()
assert release_free_memory()
print(before - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_free_pages_of_small_blocks_go_back_when_released():
    """Blocks under the mapping threshold stay in the heap when freed; release_free_memory
    hands their pages back (the pipeline does so between jobs, the simulation between batches)."""
    out = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, check=True).stdout
    assert float(out) > 250, out     # MiB of the ~400 freed


def test_a_job_in_a_child_process_returns_its_result_and_raises_its_error():
    """The pipeline's heavy jobs run in a child process: the result comes back, and so does an
    error, with its type and message."""
    import functools
    import math

    from synclib.run.pipeline import run_in_child

    assert run_in_child(functools.partial(math.pow, 2), (10,)) == 1024
    with pytest.raises(ValueError, match="invalid literal"):
        run_in_child(int, ("not a number",))


def test_a_job_in_a_child_process_asks_for_huge_pages(monkeypatch):
    """The child's environment carries glibc's huge-page tunable, added to the user's own
    tunables; this process's environment is as it was; a user's own hugetlb setting stands."""
    import functools

    from synclib.memory import HUGE_PAGES_TUNABLE
    from synclib.run.pipeline import run_in_child

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.check=0")
    seen = run_in_child(functools.partial(os.getenv, "GLIBC_TUNABLES"))
    assert seen == f"glibc.malloc.check=0:{HUGE_PAGES_TUNABLE}"
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.check=0"
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert run_in_child(functools.partial(os.getenv, "GLIBC_TUNABLES")) == HUGE_PAGES_TUNABLE
    assert "GLIBC_TUNABLES" not in os.environ
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    assert run_in_child(functools.partial(os.getenv, "GLIBC_TUNABLES")) == "glibc.malloc.hugetlb=0"


def test_tree_rss_counts_the_children():
    """A child holding 300 MB shows in this process's tree (bytes), not in its own RSS."""
    import time

    from synclib.memory import rss_bytes, tree_rss_bytes

    code = "import sys, time; b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); print('ok', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ok"
        time.sleep(0.2)
        assert tree_rss_bytes() - rss_bytes() > 250 << 20
    finally:
        child.kill()
        child.wait()


def _gone(pid: int) -> bool:
    from pathlib import Path

    try:  # a killed process whose new parent does not reap it stays a zombie ('Z')
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_job_in_a_child_dies_with_a_killed_run():
    """SIGKILL to a run leaves no job running on behind it (its child process is killed too),
    so a resumed run never shares its files with a stray writer."""
    import time
    from pathlib import Path

    from synclib.memory import _children

    run = subprocess.Popen([sys.executable, "-c", "import time; from synclib.run.pipeline import run_in_child; "
                            "run_in_child(time.sleep, (120,))"])
    try:
        deadline, jobs = time.time() + 60, []
        while not jobs and time.time() < deadline:
            time.sleep(0.2)
            jobs = [p for p in _children(run.pid)
                    if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert jobs, "the job's child process did not start"
        time.sleep(1)  # its start-up done (a run killed before would also end it: _child_init)
        run.kill()
        run.wait()
        deadline = time.time() + 10
        while not all(_gone(p) for p in jobs) and time.time() < deadline:
            time.sleep(0.1)
        assert all(_gone(p) for p in jobs)
    finally:
        run.kill()


def test_device_budget_stores_while_the_device_keeps_its_reserve():
    """On CUDA the session caches take what the device can give beyond a reserve, asked at
    every store (a fixed share at start left sessions out once the slots had grown)."""
    from synclib.memory import DeviceBudget

    free = [10 * GiB]
    budget = DeviceBudget(lambda: free[0], reserve=2 * GiB)
    assert budget.take(5 * GiB) and budget.used == 5 * GiB
    free[0] -= 5 * GiB                      # the device gave those bytes
    assert budget.limit == 8 * GiB          # held + what is left beyond the reserve
    assert not budget.take(4 * GiB) and budget.used == 5 * GiB
    free[0] -= 2 * GiB                      # the decoding slots grew meanwhile
    assert not budget.take(2 * GiB) and budget.take(1 * GiB) and budget.peak == 6 * GiB
    budget.give(6 * GiB)
    assert budget.used == 0
    with pytest.raises(ValueError, match="reserve must be >= 0"):
        DeviceBudget(lambda: 0, reserve=-1)
