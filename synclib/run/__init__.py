"""The run: the main job as a graph of jobs, and its plan.

Read first: :mod:`synclib.run.pipeline` turns a run config into jobs (simulate, judge, analyze per ordered run;
the manifest, the pages, each notebook and the book), skips those whose stamp matches (:mod:`synclib.stamps`) and
executes the rest with Dask, on this machine or a cluster. ``synclib run --dry-run`` is :mod:`synclib.run.plan`,
priced on a GPU config by :mod:`synclib.run.price`. Their command lines live in :mod:`synclib.cli`.

Modules
-------
``pipeline``  Run, runs, Job, build_jobs, the step_* functions, execute
``plan``      JobPlan, plan, format_plan, plan_summary (imported by pipeline, never the reverse)
``price``     loop_reference, price_simulation, price_analysis, price_judge, logins, check_scheduler
"""
