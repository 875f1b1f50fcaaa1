"""synclib: the reproducible companion to *Neural Synchrony Between Socially
Interacting Language Models* (ICLR 2026).

Modules
-------
scenarios  Sotopia-format tasks and the three prompt views (active, passive, ToM)
models     loading causal LMs (hub id, local dir, GGUF, embedded short names)
engine     hooked, batched generation that records last-prompt-token states
simulate   the dialog loop over tasks and seeds, writing activation cubes
cube       netCDF4 activation cubes (crash-safe writing, lazy opening)
ridge      batched ridge regression and R^2 grids (numpy or torch, CPU or CUDA)
analysis   datasets, splits, SyncR^2 and its controls and sensitivity analyses
tom        Theory-of-Mind decoding (appendix J)
judge      Sotopia-eval judging (OpenAI-compatible endpoint or local model)
stats      correlations and partial correlations
plots      altair charts used by the notebooks
pipeline   the main job: config -> simulate -> judge -> analyse -> notebooks -> book
"""

__version__ = "0.1.0"
