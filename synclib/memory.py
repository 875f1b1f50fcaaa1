"""Host memory: how much there is, handing freed memory back, and the budget of the session caches.

The session caches (every live dialog's prompt keys/values, :class:`synclib.engine.Engine`) trade memory for
time: a session that does not fit is recomputed from its prompt on its next turn.  :class:`CacheBudget` is the
one budget a model pair's engines share, sized by :func:`session_budget` from the memory available.

glibc's ``malloc`` keeps freed blocks of up to 32 MiB in its heap, which caches and batches of changing sizes
fragment; :func:`return_freed_memory` sends blocks of 1 MiB and more back to the system, and
:func:`huge_pages_in_children` has the run's jobs fault their pages in 2 MiB at a time.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import numbers
import os
import sys
from contextlib import contextmanager
from pathlib import Path

__all__ = ["run_in_child", "GiB", "CacheBudget", "DeviceBudget", "device_free_bytes", "available_bytes",
           "session_budget", "check_cache_gib", "return_freed_memory", "release_free_memory", "huge_pages_in_children",
           "rss_bytes", "tree_rss_bytes", "die_with_parent", "PeakRSS"]

GiB = 1 << 30
#: the session budget's bounds: below the floor nothing useful fits, above the cap more reuse buys little
BUDGET_FLOOR, BUDGET_CAP = 256 << 20, 4 * GiB
#: share of the available memory the session caches may take when ``auto``
BUDGET_SHARE = 0.25


def available_bytes() -> int | None:
    """Bytes this process can still take: ``MemAvailable``, bounded by a cgroup's limit; None where unknown."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            used = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            avail = min(avail, max(0, int(limit) - used))
        break
    return avail


#: what ``simulate.cache_gib`` may be (:func:`check_cache_gib`)
CACHE_GIB_RULE = "'auto' or a number >= 0"


def check_cache_gib(setting):
    """``setting`` if it follows :data:`CACHE_GIB_RULE`, else ValueError; the one check of ``simulate.cache_gib``."""
    if setting == "auto" or (isinstance(setting, numbers.Real) and not isinstance(setting, bool)
                             and setting >= 0):
        return setting
    raise ValueError(f"cache_gib must be {CACHE_GIB_RULE}, got {setting!r}")


def session_budget(setting="auto", *, available: int | None = None) -> int:
    """Bytes the session caches of one simulation may hold (all its engines together).

    Parameters
    ----------
    setting : "auto" or number
        GiB (``simulate.cache_gib``), or ``"auto"``: a quarter of the memory available, at least 256 MiB and at
        most 4 GiB (4 GiB where unknown).
    available : int, optional
        Bytes available (default: measured now).
    """
    setting = check_cache_gib(setting)
    if setting != "auto":
        return int(float(setting) * GiB)
    avail = available_bytes() if available is None else available
    if avail is None:
        return BUDGET_CAP
    return int(min(BUDGET_CAP, max(BUDGET_FLOOR, BUDGET_SHARE * avail)))


class CacheBudget:
    """A budget of ``limit`` bytes that several engines' session caches draw on; ``used`` bytes held now,
    ``peak`` the most at once."""

    def __init__(self, limit: int):
        if int(limit) < 0:
            raise ValueError(f"limit must be >= 0 bytes, got {limit}")
        self.limit = int(limit)
        self.used = 0
        self.peak = 0

    def take(self, nbytes: int) -> bool:
        """Reserve ``nbytes``; False (nothing reserved) if they do not fit."""
        if not self.fits(nbytes):
            return False
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        return True

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit in the budget."""
        return self.used + nbytes <= self.limit

    def give(self, nbytes: int) -> None:
        """Release ``nbytes`` reserved by :meth:`take`."""
        self.used -= nbytes

    def __repr__(self) -> str:
        return f"CacheBudget({self.used / GiB:.2f} of {self.limit / GiB:.2f} GiB used)"


#: the share of the device's memory (at least 2 GiB) a :class:`DeviceBudget` leaves free for decoding and slack
DEVICE_RESERVE_SHARE, DEVICE_RESERVE_FLOOR = 0.10, 2 * GiB


def device_free_bytes(device) -> int:
    """Bytes a CUDA ``device`` can still hand out: free, plus reserved but unused by PyTorch's allocator."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


class DeviceBudget(CacheBudget):
    """A session-cache budget that asks the device at every store: a session is stored while the device keeps
    ``reserve`` bytes free after it.  Should a later allocation run out of memory anyway, the engine drops the
    session caches and retries (``stats["oom_cache_drops"]``).

    Parameters
    ----------
    free_bytes : callable
        ``free_bytes() -> int``, e.g. :func:`device_free_bytes` of the model's device.
    reserve : int
        Bytes to leave free.
    """

    def __init__(self, free_bytes, reserve: int):
        if int(reserve) < 0:
            raise ValueError(f"reserve must be >= 0 bytes, got {reserve}")
        self.free_bytes, self.reserve = free_bytes, int(reserve)
        self.used = self.peak = 0

    @classmethod
    def for_device(cls, device) -> "DeviceBudget":
        """The budget of a CUDA ``device``, leaving :data:`DEVICE_RESERVE_SHARE` of it free."""
        import torch

        total = torch.cuda.get_device_properties(device).total_memory
        return cls(lambda: device_free_bytes(device), max(DEVICE_RESERVE_FLOOR, int(DEVICE_RESERVE_SHARE * total)))

    @property
    def limit(self) -> int:
        """The bytes held now plus those the device could still give (changes as it fills)."""
        return self.used + max(0, self.free_bytes() - self.reserve)

    def fits(self, nbytes: int) -> bool:
        """Whether the device keeps ``reserve`` bytes free after ``nbytes`` more."""
        return self.free_bytes() - nbytes >= self.reserve

    def __repr__(self) -> str:
        return (f"DeviceBudget({self.used / GiB:.2f} GiB used, {self.reserve / GiB:.2f} GiB of the device "
                f"kept free)")


_LIBC = None


def _glibc():
    """glibc, with ``mallopt`` and ``malloc_trim`` (None off Linux or without glibc)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim"):
                    _LIBC = libc
            except OSError:
                pass
    return _LIBC or None


#: glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: blocks of this size and more are mapped on their own and go back to the system when freed
MMAP_THRESHOLD = 1 << 20


def return_freed_memory() -> bool:
    """Have glibc's ``malloc`` map blocks of 1 MiB or more on their own, so that freeing one returns it to the
    system, at the price of page faults (kept out of decoding steps by :func:`synclib.engine.with_room`).  Once
    per process; True where it applies (Linux with glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    return libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, MMAP_THRESHOLD) == 1


def release_free_memory() -> bool:
    """Hand the heap's free pages (blocks under 1 MiB) back to the system (``malloc_trim``); True where it applies."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


#: glibc's (2.35+) tunable asking for transparent huge pages; read at process start, so set for children only
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


@contextmanager
def huge_pages_in_children():
    """Processes started inside this context get :data:`HUGE_PAGES_TUNABLE` (added to ``GLIBC_TUNABLES``):
    with transparent huge pages on, malloc's blocks fault in 2 MiB at a time instead of 4 KiB, which a
    simulation returning its freed blocks (:func:`return_freed_memory`) does all the time.  A user's own
    setting stands; elsewhere the variable changes nothing."""
    before = os.environ.get("GLIBC_TUNABLES")
    if HUGE_PAGES_TUNABLE.split("=")[0] in (before or ""):
        yield  # the user's own setting stands
        return
    os.environ["GLIBC_TUNABLES"] = f"{before}:{HUGE_PAGES_TUNABLE}" if before else HUGE_PAGES_TUNABLE
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GLIBC_TUNABLES", None)
        else:
            os.environ["GLIBC_TUNABLES"] = before


def rss_bytes(pid: int | str = "self") -> int | None:
    """A process's resident bytes now (default this process; None where unknown)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _children(pid: int | str) -> list[int]:
    """The child processes of ``pid`` (Linux; none where the system does not say)."""
    out = []
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(c) for c in f.read_text().split()]
        except (OSError, ValueError):
            pass
    return out


def tree_rss_bytes() -> int | None:
    """The resident bytes of this process and all its descendants together."""
    total, todo, seen = rss_bytes(), _children("self"), set()
    if total is None:
        return None
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += rss_bytes(pid) or 0
        todo += _children(pid)
    return total


def die_with_parent() -> bool:
    """Have the kernel kill this process when its parent dies (``PR_SET_PDEATHSIG``); True where it applies."""
    libc = _glibc()
    if libc is None:
        return False
    import signal

    return libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0


class PeakRSS:
    """The peak resident memory of a block of work, sampled every ``interval`` seconds by a thread (``VmHWM``
    covers the process's whole life): ``with PeakRSS() as p: ...``, then ``p.bytes`` (None where unknown).  With
    ``tree``, over this process and its descendants."""

    def __init__(self, interval: float = 0.1, tree: bool = False):
        self.interval = interval
        self._now = tree_rss_bytes if tree else rss_bytes
        self.bytes = self._now()
        self._stop = None

    def __enter__(self):
        import threading

        self._stop = threading.Event()

        def sample():
            while not self._stop.wait(self.interval):
                now = self._now()
                if now is not None and (self.bytes is None or now > self.bytes):
                    self.bytes = now

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        now = self._now()
        if now is not None and (self.bytes is None or now > self.bytes):
            self.bytes = now
        return False


# --------------------------------------------------------------------------- a child process per job
def _child_init(parent: int) -> None:
    die_with_parent()  # a killed run leaves no job running on behind it
    if os.getppid() != parent:  # the run died before the line above took effect
        os._exit(1)
    # glibc's allocator as it comes: synclib.memory.return_freed_memory's setting slows a fresh analysis 1.8 times


def _in_child(func, args: tuple):
    try:
        return func(*args)
    finally:
        sys.stdout.flush()  # the job's own lines before the parent's "done"
        sys.stderr.flush()


def run_in_child(func, args: tuple = ()):
    """``func(*args)`` in a fresh ``spawn`` child process that dies with this one (no heap inherited; huge pages:
    :func:`huge_pages_in_children`); its result or exception comes back.  Arguments must pickle."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with huge_pages_in_children(), ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                       initializer=_child_init, initargs=(os.getpid(),)) as pool:
        return pool.submit(_in_child, func, tuple(args)).result()
