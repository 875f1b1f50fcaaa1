"""The config's ``cluster:`` block (:mod:`synclib.cluster`): checked when the config loads,
printed by the dry run with the job script dask-jobqueue would submit (issue 62, item 2).

The job scripts are written by dask-jobqueue's own job classes (nothing is submitted here;
``tests/test_slurm.py`` submits them to a real SLURM)."""
from __future__ import annotations

import os
import re

import dask
import pytest
import yaml

from conftest import REPO
from synclib import cli
from synclib.cluster import ClusterError, ClusterSpec, parse_duration
from synclib.config import ConfigError, load_config

pytest.importorskip("dask_jobqueue")

SLURM = {"type": "slurm", "jobs": 8, "cores": 8, "memory": "64GB", "walltime": "08:00:00"}
JOB = {"cores": 8, "memory": "64GB"}


def test_a_gpu_job_runs_one_worker_process_with_one_gpu_and_leaves_before_its_walltime():
    """The documented spec once asked for 4 worker processes under one --gres=gpu:1 (dask-jobqueue's
    default for 8 cores): now one process, the resource GPU=1, --gres=gpu:1, and a lifetime that ends
    every worker 5-30 minutes before the walltime (auto: 5 % of it, and a 2 % stagger)."""
    spec = ClusterSpec.from_config(SLURM, gpu=True)
    assert (spec.type, spec.jobs, spec.gpus, spec.options["processes"]) == ("slurm", 8, 1, 1)
    assert spec.walltime == 8 * 3600 and spec.walltime_source == "cluster.walltime"
    assert spec.lifetime + spec.lifetime_stagger == pytest.approx(8 * 3600 - 0.05 * 8 * 3600)
    script = spec.job_script()
    assert "#SBATCH --gres=gpu:1" in script and "#SBATCH -t 08:00:00" in script
    assert "--nworkers" not in script and "--nthreads 8" in script
    assert "--resources GPU=1" in script and f"--lifetime {spec.lifetime:.0f}s" in script
    assert "--lifetime-stagger 300s" in script
    # dask-jobqueue itself would have split the job into four workers sharing the card
    from dask_jobqueue.slurm import SLURMJob
    plain = SLURMJob(scheduler="tcp://x:1", name="w", cores=8, memory="64GB").job_script()
    assert "--nworkers 4" in plain


def test_without_a_walltime_the_batch_systems_default_is_named_and_lived_within():
    spec = ClusterSpec.from_config({"type": "slurm", "jobs": 2, "cores": 4, "memory": "32GB"}, gpu=True)
    default = parse_duration(dask.config.get("jobqueue.slurm.walltime"), "w")
    assert spec.walltime == default and "set cluster.walltime" in spec.walltime_source
    assert spec.lifetime + spec.lifetime_stagger < default
    assert "dask-jobqueue's default" in "\n".join(spec.describe())


@pytest.mark.parametrize("block, says", [
    ({"type": "slrum"}, "did you mean 'slurm'"),
    ({"type": "slurm", "processes": 4, **JOB}, "one worker process"),
    ({"type": "slurm", "cors": 8}, "did you mean 'cores'"),
    ({"type": "slurm", "gpus": 2, **JOB}, "cluster.gpus = 2"),
    ({"type": "slurm", "gpus": 0, **JOB}, "cluster.gpus = 0 on a run that computes on a GPU"),
    ({"type": "slurm", "walltime": "2h", "lifetime": "2h", **JOB}, "reaches the walltime"),
    ({"type": "slurm", "walltime": "soon", **JOB}, "not a duration"),
    ({"type": "slurm", "n_workers": 3, **JOB}, "cluster.jobs"),
    ({"type": "slurm", "worker_extra_args": ["--resources", "GPU=1"], **JOB}, "drop them there"),
    ({"scheduler": "tcp://head:8786", "jobs": 2}, "takes no other key"),
    ({"jobs": 2}, "needs 'type'"),
    ({"type": "slurm", "cores": 8}, "cluster.memory: say what each worker job asks for"),
])
def test_a_bad_cluster_block_is_refused_naming_the_key(block, says):
    with pytest.raises(ClusterError, match=None) as err:
        ClusterSpec.from_config(block, gpu=True)
    assert says in str(err.value) and "cluster" in str(err.value)


def test_walltime_forms_are_read_as_the_batch_systems_read_them():
    assert parse_duration("08:00:00", "w") == 8 * 3600
    assert parse_duration("1-02:00:00", "w") == 26 * 3600
    assert parse_duration("30:00", "w") == 30 * 60
    assert parse_duration(90, "w") == 90 * 60  # minutes, as sbatch -t 90
    assert parse_duration("7h", "w") == 7 * 3600
    spec = ClusterSpec.from_config({"type": "slurm", "walltime": "7h", "cores": 2, "memory": "8GB"}, gpu=False)
    assert spec.options["walltime"] == "07:00:00"  # written in SLURM's own form
    lsf = ClusterSpec.from_config({"type": "lsf", "walltime": "7h", "cores": 2, "memory": "8GB"}, gpu=False)
    assert lsf.options["walltime"] == "07:00"


def test_a_cpu_cluster_asks_for_no_gpu_and_a_named_scheduler_is_taken_as_it_is():
    spec = ClusterSpec.from_config({"type": "slurm", "cores": 2, "memory": "4GB"}, gpu=False)
    assert spec.gpus == 0 and "--gres" not in spec.job_script() and "GPU=" not in spec.job_script()
    named = ClusterSpec.from_config({"scheduler": "tcp://head:8786"})
    assert named.scheduler == "tcp://head:8786" and named.job_script() is None


def test_the_config_checks_the_block_when_it_loads_naming_the_file(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cfg["cluster"] = {"type": "slurm", "processes": 4}
    cfg["notebooks"]["ability_scores"] = str(REPO / "data" / "ability_scores.csv")
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert str(f) in str(err.value) and "cluster.processes = 4" in str(err.value)
    with pytest.raises(ConfigError, match="did you mean 'slurm'"):
        load_config(REPO / "config" / "paper.yaml", ["cluster={type: slrum}"])


def test_the_dry_run_prints_the_cluster_and_its_job_script(tmp_path, capsys):
    """The paper's grid on SLURM: jobs, walltime, lifetime, the wall time on 8 GPU jobs, whether
    a worker outlives a cube part, and the script each job runs."""
    args = ["run", "--config", str(REPO / "config" / "paper.yaml"), "--dry-run", "--set", f"results_dir={tmp_path}",
            "--set", "cluster={type: slurm, jobs: 8, walltime: '08:00:00', cores: 8, memory: 96GB}"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "cluster: slurm, up to 8 worker job(s) at once" in out
    assert "each worker leaves after 7h31m" in out and "with 8 GPU job(s) at once" in out
    assert "a cube part takes up to" in out
    assert "#SBATCH --gres=gpu:1" in out and "--resources GPU=1" in out and "--lifetime 27060s" in out
    short = args[:-1] + ["cluster={type: slurm, jobs: 8, walltime: '00:20:00', cores: 8, memory: 96GB}"]
    assert cli.main(short) == 0
    assert "WARNING: one cube part takes up to" in capsys.readouterr().out


def test_without_a_cluster_block_the_dry_run_gives_the_job_array(tmp_path, capsys):
    """The paper's config has no cluster: block: its dry run says how to submit the grid as the
    job array of config/slurm/runs.sbatch (36 tasks), the script's directives, and how often the
    longest simulation requeues itself within the script's walltime."""
    args = ["run", "--config", "config/paper.yaml", "--dry-run", "--set", f"results_dir={tmp_path}"]
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        assert cli.main(args) == 0
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert "sbatch --array=0-35%8 config/slurm/runs.sbatch config/paper.yaml" in out
    assert "--runs $SLURM_ARRAY_TASK_ID --steps simulate,analyze" in out
    assert "--gres=gpu:1" in out and "--time=08:00:00" in out and "--signal=B:USR1@300" in out
    assert re.search(r"the longest simulation takes ~\d+ h: within --time=08:00:00 it requeues itself about \d+ "
                     r"time\(s\)", out)
