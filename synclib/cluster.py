"""The config's ``cluster:`` block as one checked object: :class:`ClusterSpec`.

Either ``cluster: {scheduler: tcp://HEAD:8786}``, a running scheduler with workers of its own (as ``synclib run
--scheduler``), or ``cluster: {type: slurm, jobs: 8, walltime: "08:00:00", ...}``: `dask-jobqueue
<https://jobqueue.dask.org>`_ submits worker jobs to the batch system (``slurm``, ``pbs``, ``sge``, ``lsf``;
``local`` starts worker processes here). The rules that keep a GPU grid alive for days on jobs that live hours,
as dask-jobqueue's documentation advises (*How to handle job queueing system walltime killing workers*):

- **One worker process per job** (``processes: 1``), so a GPU is never shared.
- **One GPU per job** (``gpus``): the worker offers the resource ``GPU=1`` the GPU jobs ask for; SLURM jobs ask
  for ``--gres=gpu:1`` (on PBS, SGE and LSF, give your site's directive in ``job_extra_directives``).
- **Workers leave before the walltime** (``lifetime`` +- ``lifetime_stagger``), so the batch system never kills
  one mid-write; a simulation on a leaving worker resumes elsewhere from its cube's parts.
- **Adaptive jobs** (``jobs`` at most), replaced when they end, so the grid outlives any one job (a fixed
  ``scale(jobs=N)`` leaves no workers once the first N end).

Every other key goes to the dask-jobqueue class, its name checked against that class's parameters.
"""
from __future__ import annotations

import difflib
import inspect
import re
from dataclasses import dataclass, field

__all__ = ["ClusterError", "ClusterSpec", "TYPES", "OWN_KEYS", "SCHEDULER_PLACEHOLDER", "spec_of",
           "is_scheduler_address", "parse_duration", "duration_text"]

#: ``cluster.type`` -> dask-jobqueue's cluster class (``local``: distributed's LocalCluster)
TYPES = {"local": "LocalCluster", "slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster",
         "lsf": "LSFCluster"}
#: the job classes whose parameters a ``cluster`` key may name (beside the cluster's own)
_JOBS = {"slurm": ("slurm", "SLURMJob"), "pbs": ("pbs", "PBSJob"), "sge": ("sge", "SGEJob"),
         "lsf": ("lsf", "LSFJob")}
#: keys synclib reads itself; every other key goes to the cluster class
OWN_KEYS = ("scheduler", "type", "jobs", "gpus", "walltime", "lifetime", "lifetime_stagger")
#: keys synclib sets and a config may not: how many workers run is ``jobs`` (adaptive)
_SET_BY_US = {"n_workers": "cluster.jobs (the most worker jobs at once; the cluster adapts)",
              "name": "nothing (synclib names the workers)"}
#: the placeholder address a printed job script names (the real one is the run's scheduler)
SCHEDULER_PLACEHOLDER = "tcp://SCHEDULER:8786"


class ClusterError(ValueError):
    """A ``cluster:`` block is invalid; the message names the key (``cluster.KEY``)."""


def is_scheduler_address(text) -> bool:
    """Whether ``text`` reads as a dask scheduler's address (``tcp://10.0.0.1:8786``, ``host:8786``)."""
    return isinstance(text, str) and bool(re.fullmatch(r"(tcp|tls|inproc|ucx)://\S+|[\w.-]+:\d+", text))


# --------------------------------------------------------------------------- durations
_CLOCK = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration(value, key: str) -> float:
    """Seconds of a batch-system duration: ``"HH:MM:SS"``, ``"MM:SS"``, ``"D-HH:MM:SS"``, ``"D-HH"`` (SLURM's
    forms), a number of minutes (as ``sbatch -t 90``), or a Dask time such as ``"7h"``; else ClusterError
    naming ``key``."""
    bad = ClusterError(f"{key} = {value!r} is not a duration: give 'HH:MM:SS', 'D-HH:MM:SS', minutes, "
                       "or a time such as '7h'")
    if isinstance(value, bool):
        raise bad
    if isinstance(value, (int, float)):
        if value <= 0:
            raise bad
        return float(value) * 60
    if not isinstance(value, str) or not value.strip():
        raise bad
    text = value.strip()
    m = _CLOCK.match(text)
    if m:
        days, a, b, c = m.groups()
        nums = [int(x) for x in (a, b, c) if x is not None]
        if days is not None:  # D-HH[:MM[:SS]]
            h, mi, s = (nums + [0, 0])[:3]
            secs = int(days) * 86400 + h * 3600 + mi * 60 + s
        elif len(nums) == 3:
            secs = nums[0] * 3600 + nums[1] * 60 + nums[2]
        elif len(nums) == 2:  # MM:SS
            secs = nums[0] * 60 + nums[1]
        else:  # minutes
            secs = nums[0] * 60
    else:
        from dask.utils import parse_timedelta  # dask's own reading of "7h", "450m", "90s"

        try:
            secs = parse_timedelta(text, default="s")
        except (ValueError, KeyError, TypeError):
            raise bad from None
    if not secs or secs <= 0:
        raise bad
    return float(secs)


def duration_text(secs: float) -> str:
    """``27060`` -> ``"7h31m"``; ``1440`` -> ``"24m"``; ``45`` -> ``"45s"``."""
    secs = int(round(secs))
    h, rest = divmod(secs, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m" if m else f"{h}h"
    return f"{m}m" if m and not s else f"{m}m{s:02d}s" if m else f"{s}s"


# --------------------------------------------------------------------------- the spec
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _class(kind: str):
    """The cluster class of ``kind`` (imports dask-jobqueue or distributed)."""
    if kind == "local":
        from distributed import LocalCluster

        return LocalCluster
    try:
        import dask_jobqueue
    except ImportError:  # pragma: no cover - the cluster extra is part of make venv
        raise ClusterError(f"cluster.type = {kind!r} needs dask-jobqueue: pip install 'synclib[cluster]'") from None
    return getattr(dask_jobqueue, TYPES[kind])


def _parameters(kind: str) -> set[str]:
    """The keyword arguments the cluster class of ``kind`` takes (its job class's too)."""
    names = set(inspect.signature(_class(kind).__init__).parameters)
    if kind in _JOBS:
        import importlib

        from dask_jobqueue.core import Job

        mod, cls = _JOBS[kind]
        job = getattr(importlib.import_module(f"dask_jobqueue.{mod}"), cls)
        names |= set(inspect.signature(Job.__init__).parameters) | set(inspect.signature(job.__init__).parameters)
    return names - {"self", "kwargs", "base_class_kwargs", "job_kwargs", "worker_kwargs", "scheduler"}


def _default_walltime(kind: str) -> str | None:
    """dask-jobqueue's configured walltime (``jobqueue.KIND.walltime``, 30 minutes as shipped)."""
    import dask

    return dask.config.get(f"jobqueue.{kind}.walltime", default=None)


def _auto_lifetime(walltime: float) -> tuple[float, float]:
    """Lifetime and stagger (s) for jobs of ``walltime`` s: the latest worker leaves 5 % of it (5 to 30 min) before
    its end; the stagger, 2 % (1 to 5 min), keeps the workers from all being replaced at once."""
    margin = min(max(0.05 * walltime, 300.0), 1800.0)
    stagger = min(max(0.02 * walltime, 60.0), 300.0)
    return max(walltime - margin - stagger, 60.0), stagger


@dataclass(frozen=True)
class ClusterSpec:
    """A checked ``cluster:`` block (:meth:`from_config`): ``scheduler`` (a running one's address) or ``type``;
    ``jobs`` (the most at once), ``gpus`` per job (0 or 1), ``walltime`` (s; the config's, else dask-jobqueue's;
    None for ``local``) and its source, ``lifetime`` +- ``lifetime_stagger`` (s; None: none), and ``options``,
    every other key for the cluster class (``processes`` 1 where not given)."""

    scheduler: str | None = None
    type: str | None = None
    jobs: int = 1
    gpus: int = 0
    walltime: float | None = None
    walltime_source: str = ""
    lifetime: float | None = None
    lifetime_stagger: float | None = None
    options: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ checking
    @classmethod
    def from_config(cls, block: dict | None, gpu: bool = False) -> ClusterSpec | None:
        """Check a config's ``cluster`` mapping (None for none); ClusterError names the key, the value and what
        is allowed, or the fix. ``gpu``: the run's models may compute on a GPU, so its GPU jobs hold one each."""
        if block is None:
            return None
        if not isinstance(block, dict):
            raise ClusterError(f"cluster must be a mapping, got {block!r}")
        block = dict(block)
        if "scheduler" in block:
            others = sorted(k for k in block if k != "scheduler")
            if others:
                raise ClusterError(f"cluster.scheduler names a running scheduler; it takes no other key "
                                   f"(got {', '.join(others)}): drop them, or drop cluster.scheduler and give "
                                   "cluster.type to let dask-jobqueue start one")
            addr = block["scheduler"]
            if not is_scheduler_address(addr):
                raise ClusterError(f"cluster.scheduler = {addr!r} is not a scheduler address like tcp://10.0.0.1:8786")
            return cls(scheduler=addr)
        kind = block.pop("type", None)
        if kind is None:
            raise ClusterError("cluster needs 'type' (one of " + ", ".join(TYPES) + ") or 'scheduler' (the address "
                               "of a running scheduler)")
        if not isinstance(kind, str) or kind.lower() not in TYPES:
            close = difflib.get_close_matches(str(kind).lower(), list(TYPES), n=1, cutoff=0.5)
            raise ClusterError(f"cluster.type = {kind!r} is not allowed: must be one of {', '.join(TYPES)}"
                               + (f" (did you mean {close[0]!r}?)" if close else ""))
        kind = kind.lower()
        jobs = block.pop("jobs", 1)
        if not _is_int(jobs) or jobs < 1:
            raise ClusterError(f"cluster.jobs = {jobs!r} is not allowed: must be an integer >= 1 (the most worker "
                               "jobs at once)")
        gpus = block.pop("gpus", 1 if gpu else 0)
        if not _is_int(gpus) or gpus not in (0, 1):
            raise ClusterError(f"cluster.gpus = {gpus!r} is not allowed: must be 0 or 1 (one worker process per job, "
                               "one GPU each; for more GPUs at once raise cluster.jobs)")
        if gpu and gpus == 0:
            raise ClusterError("cluster.gpus = 0 on a run that computes on a GPU (device cuda, or auto): its simulations "
                               "would find no worker with a GPU; drop cluster.gpus (1 there), or set device: cpu")
        processes = block.get("processes", 1)
        if gpus and processes != 1:
            raise ClusterError(f"cluster.processes = {processes!r}: a GPU job runs one worker process, or its card "
                               "is shared by several; drop cluster.processes (1 by default) and raise cluster.jobs "
                               "for more GPUs at once")
        if not _is_int(processes) or processes < 1:
            raise ClusterError(f"cluster.processes = {processes!r} is not allowed: must be an integer >= 1")
        stagger_given = block.pop("lifetime_stagger", None)
        lifetime_given = block.pop("lifetime", "auto")
        walltime_given = block.pop("walltime", None)
        options = cls._options(kind, block, processes)
        walltime, source = None, ""
        if kind != "local":
            if walltime_given is not None:
                walltime, source = parse_duration(walltime_given, "cluster.walltime"), "cluster.walltime"
                options["walltime"] = _clock(walltime, kind)  # the batch system's own form
            elif (default := _default_walltime(kind)) is not None:
                walltime = parse_duration(default, f"jobqueue.{kind}.walltime")
                source = f"dask-jobqueue's default (jobqueue.{kind}.walltime); set cluster.walltime"
        elif walltime_given is not None:
            raise ClusterError("cluster.walltime: a local cluster's workers have no walltime; drop it")
        lifetime, stagger = cls._lifetime(lifetime_given, stagger_given, walltime)
        return cls(None, kind, jobs, gpus, walltime, source, lifetime, stagger, options)

    @staticmethod
    def _options(kind: str, block: dict, processes: int) -> dict:
        """The keys that go to the cluster class, their names checked against it."""
        allowed = _parameters(kind)
        for key in block:
            if key in _SET_BY_US:
                raise ClusterError(f"cluster.{key} is set by synclib; use {_SET_BY_US[key]}")
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed | set(OWN_KEYS)), n=1, cutoff=0.6)
                raise ClusterError(f"cluster.{key} is not a setting of synclib's cluster block ({', '.join(OWN_KEYS)}) "
                                   f"nor of {TYPES[kind]}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        options = dict(block)
        if kind != "local":
            import dask  # the batch system's defaults (jobqueue.KIND.*), loaded with the cluster block

            lacking = [k for k in ("cores", "memory") if options.get(k) is None
                       and dask.config.get(f"jobqueue.{kind}.{k}", default=None) is None]
            if lacking:
                raise ClusterError(f"cluster.{' and cluster.'.join(lacking)}: say what each worker job asks for, "
                                   "e.g. cores: 8, memory: 96GB (a GPU job's host memory holds the weights while they "
                                   "load and the analysis' rows)")
        extra = list(options.get("worker_extra_args") or [])
        taken = [a for a in extra if str(a).split("=")[0] in ("--resources", "--lifetime", "--lifetime-stagger",
                                                              "--nworkers", "--nprocs")]
        if taken:
            raise ClusterError(f"cluster.worker_extra_args sets {', '.join(map(str, taken))}, which synclib sets from "
                               "cluster.gpus, cluster.lifetime and cluster.processes: drop them there")
        if kind == "local":
            options.setdefault("processes", True)
            options.setdefault("threads_per_worker", 1)
        else:
            options["processes"] = processes
        return options

    @staticmethod
    def _lifetime(given, stagger_given, walltime: float | None) -> tuple[float | None, float | None]:
        if given in (None, "none", False):
            return None, None
        if given == "auto":
            if walltime is None:
                return None, None
            lifetime, stagger = _auto_lifetime(walltime)
        else:
            lifetime = parse_duration(given, "cluster.lifetime")
            stagger = 0.0
        if stagger_given is not None:
            stagger = parse_duration(stagger_given, "cluster.lifetime_stagger")
        if walltime is not None and lifetime + stagger >= walltime:
            raise ClusterError(f"cluster.lifetime = {given!r} (+ its stagger {duration_text(stagger)}) reaches the "
                               f"walltime {duration_text(walltime)}: the batch system would kill workers mid-write; "
                               "give a shorter lifetime, or 'auto'")
        return lifetime, stagger

    # ------------------------------------------------------------------ using it
    def worker_args(self) -> list[str]:
        """The arguments synclib adds to each worker's command line."""
        args = list(self.options.get("worker_extra_args") or [])
        if self.gpus:
            args += ["--resources", f"GPU={self.gpus}"]
        if self.lifetime is not None:
            args += ["--lifetime", f"{self.lifetime:.0f}s", "--lifetime-stagger", f"{self.lifetime_stagger or 0:.0f}s"]
        return args

    def class_kwargs(self) -> dict:
        """The keyword arguments of the cluster class (``type`` local: LocalCluster's)."""
        kw = dict(self.options)
        if self.type == "local":
            kw.setdefault("dashboard_address", None)
            if self.gpus:
                kw["resources"] = {"GPU": self.gpus}
            return kw
        kw["worker_extra_args"] = self.worker_args()
        if self.gpus and self.type == "slurm":
            directives = list(kw.get("job_extra_directives") or [])
            if not any(str(d).lstrip().startswith(("--gres", "--gpus", "-G")) for d in directives):
                directives.append(f"--gres=gpu:{self.gpus}")
            kw["job_extra_directives"] = directives
        kw.setdefault("job_name", "synclib-worker")
        return kw

    def job_script(self, scheduler: str = SCHEDULER_PLACEHOLDER) -> str | None:
        """The batch script one worker job runs, from dask-jobqueue's job class (None for ``local`` or a scheduler)."""
        if self.type in (None, "local"):
            return None
        import importlib

        mod, cls = _JOBS[self.type]
        job = getattr(importlib.import_module(f"dask_jobqueue.{mod}"), cls)
        kw = {k: v for k, v in self.class_kwargs().items()
              if k in inspect.signature(job.__init__).parameters or k in _job_parameters()}
        return job(scheduler=scheduler, name="synclib-worker", **kw).job_script()

    def make(self):
        """Start the cluster, adapting between 0 and ``jobs`` worker jobs (local: ``jobs`` worker processes)."""
        cls = _class(self.type)
        if self.type == "local":
            return cls(n_workers=self.jobs, **self.class_kwargs())
        cl = cls(**self.class_kwargs())
        cl.adapt(minimum_jobs=0, maximum_jobs=self.jobs)
        return cl

    def describe(self) -> list[str]:
        """What the dry run says of the cluster: how many jobs, their GPUs, walltime and lifetime."""
        if self.scheduler:
            return [f"cluster: the running scheduler {self.scheduler} (its workers are its own)"]
        out = [f"cluster: {self.type}, up to {self.jobs} worker job(s) at once (adaptive: jobs are submitted while "
               "work waits and replaced when they end), one worker process each"
               + (f" with {self.gpus} GPU (resource GPU={self.gpus})" if self.gpus else "")]
        if self.walltime is not None:
            out.append(f"  walltime {duration_text(self.walltime)} ({self.walltime_source})"
                       + (f"; each worker leaves after {duration_text(self.lifetime)} +- "
                          f"{duration_text(self.lifetime_stagger or 0)} (cluster.lifetime), before the walltime, and "
                          "its job is replaced; a simulation it ran resumes elsewhere from its cube's parts"
                          if self.lifetime is not None else "; no worker lifetime: jobs end at the walltime, killed "
                          "mid-job"))
        if self.gpus and self.type in ("pbs", "sge", "lsf"):
            out.append(f"  {self.type}: ask for the GPU with your site's directive in cluster.job_extra_directives "
                       "(synclib adds --gres=gpu:1 on SLURM only)")
        return out


def _clock(secs: float, kind: str) -> str:
    """A walltime as the batch system writes it: ``HH:MM`` for LSF (``bsub -W``), else ``HH:MM:SS``."""
    secs = int(round(secs))
    if kind == "lsf":
        minutes = -(-secs // 60)
        return f"{minutes // 60:02d}:{minutes % 60:02d}"
    return f"{secs // 3600:02d}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


def _job_parameters() -> set[str]:
    from dask_jobqueue.core import Job

    return set(inspect.signature(Job.__init__).parameters)


def spec_of(cfg: dict) -> ClusterSpec | None:
    """The checked cluster of a loaded config, or None; GPU jobs unless ``device`` is cpu."""
    return ClusterSpec.from_config(cfg.get("cluster"), gpu=not str(cfg.get("device")).startswith("cpu"))
