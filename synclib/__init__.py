"""synclib: the reproducible companion to *Neural Synchrony Between Socially
Interacting Language Models* (ICLR 2026).

Packages, from the bottom layer up
----------------------------------
paths, argtypes, stats, splits, penalty, memory, stamps   the base: paths, parsers, statistics, splits, the penalty
tasks/     Sotopia-format tasks, their datasets, and the prompts the models read (three views, dialog rules)
models     loading causal LMs (hub id, local dir, GGUF, embedded short names), prompt formats
engine/    hooked, batched generation that records last-prompt-token states (one concept a module)
cube/      netCDF4 activation cubes: schema, crash-safe writer, lazy reader
simulate/  the dialog loop over tasks and seeds (a dialog as one object, a scheduler), writing cubes
judge/     Sotopia-eval judging (OpenAI-compatible endpoint or local model)
analysis/  SyncR^2 from cubes: datasets, ridge, controls, sensitivity, ToM, tests; a results directory looked up
config     the run-config schema: every key's type, range, default and step
run/       the main job (config -> simulate -> judge -> analyse -> notebooks -> book) and its dry run
notebook   the figure notebooks' shared first step, and executing one (papermill)
figures/   the book's pages: one module per notebook (tables, charts, sentences, claims), the claims' registry
cli/       the ``synclib`` command line: one module per subcommand

Packages end in ``/``; ``book/architecture.md`` maps every file and the contracts between them.
"""

__version__ = "0.1.0"
