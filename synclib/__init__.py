"""synclib: the reproducible companion to *Neural Synchrony Between Socially
Interacting Language Models* (ICLR 2026).

Modules
-------
config     the run-config schema: every key's type, range, default and step
paths      where things live in the repository
plan       what a run would do (``synclib run --dry-run``)
pipeline   the main job: config -> simulate -> judge -> analyse -> notebooks -> book
scenarios  Sotopia-format tasks: the task files' vocabularies, loading and validation
prompts    the prompts the models read: the three views (active, passive, ToM), masking, dialog rules
models     loading causal LMs (hub id, local dir, GGUF, embedded short names), prompt formats
engine/    hooked, batched generation that records last-prompt-token states (one concept a module)
simulate   the dialog loop over tasks and seeds, writing activation cubes
cube/      netCDF4 activation cubes: schema, crash-safe writer, lazy reader
analysis/  datasets, splits, SyncR^2 and its controls and sensitivity analyses
ridge      batched ridge regression and R^2 grids (numpy or torch, CPU or CUDA)
splits     train/test, validation and CV splits by whole episodes (numpy only)
tom        Theory-of-Mind decoding (appendix J)
judge/     Sotopia-eval judging (OpenAI-compatible endpoint or local model)
stats      means with standard errors, correlations and partial correlations
results    a results directory as the notebooks' tidy tables
report     sentences and tables that put the run's numbers beside the paper's
run_summary the book's run summary and the embedded models page's account of the run
benchmarks the benchmarks page, quoted from ``bench/results``
plots      altair charts used by the notebooks, rendered offline
notebook   the figure notebooks' shared first step, and executing one (papermill)
synthetic  synthetic cubes and results directories for tests
cli/       the ``synclib`` command line: one module per subcommand

Packages end in ``/``; ``book/architecture.md`` maps every file and the contracts between them.
"""

__version__ = "0.1.0"
