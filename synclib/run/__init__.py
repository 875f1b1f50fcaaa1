"""The run: the main job as a graph of jobs, and its plan.

Read first: :mod:`synclib.run.pipeline` turns a run config (:mod:`synclib.config`) into
jobs (simulate, judge, analyze per ordered run; the manifest, the pages, each notebook and the
book), skips those whose stamp matches (:mod:`synclib.stamps`) and executes the rest with Dask,
on this machine or a cluster.  :mod:`synclib.run.plan` is ``synclib run --dry-run``: what would
run and why, with its time, memory and disk from the measured benchmarks; on a GPU config
:mod:`synclib.run.price` prices it (GPU-hours, GPU memory, disk, logins, the scheduler).  The command lines
that start both live in :mod:`synclib.cli`.

Modules
-------
``pipeline``  Run, runs, Job, build_jobs, the step_* functions, execute
``plan``      JobPlan, plan, format_plan, plan_summary (imported by pipeline, never the reverse)
``price``     loop_reference, price_simulation, price_analysis, price_judge, logins, check_scheduler
"""
