"""synclib: the reproducible companion to *Neural Synchrony Between Socially Interacting Language Models* (ICLR 2026).

Packages, from the bottom layer up
----------------------------------
paths, stats, splits, penalty, memory, stamps   the base: paths, statistics, splits, the penalty, memory, stamps
tasks/     Sotopia-format tasks, their datasets, and the prompts the models read (three views, dialog rules)
models     loading causal LMs (hub id, local dir, GGUF, embedded short names), prompt formats
engine/    hooked, batched generation that records last-prompt-token states (one concept a module)
cube/      netCDF4 activation cubes: schema, crash-safe writer, lazy reader
simulate/  the dialog loop over tasks and seeds (a dialog as one object, a scheduler), writing cubes
judge/     Sotopia-eval judging (OpenAI-compatible endpoint or local model)
analysis/  SyncR^2 from cubes: datasets, ridge, controls, sensitivity, ToM, tests; a results directory, its tables
           and the paper's claims judged on it (claims.json)
config     the run-config schema: every key's type, range, default and step
run/       the main job (config -> simulate -> judge -> analyse -> notebooks -> book) and its dry run
notebook   the notebooks' first step, how a page shows a chart or a table, executing a notebook (papermill)
theme      what looks the same on every page: a condition's colour, the heatmaps' scale, the axes
cli/       the ``synclib`` command line: one module per subcommand, and its value parsers

Packages end in ``/``; ``book/architecture.md`` maps every file and the contracts between them.
"""

__version__ = "0.1.0"
