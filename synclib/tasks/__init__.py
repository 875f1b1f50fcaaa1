"""The social tasks the models play: Sotopia's scenarios and personas, and the prompts built from them.

Read first: :mod:`synclib.tasks.scenarios` loads a task set (the embedded one or Sotopia's
files, fetched by :mod:`synclib.tasks.datasets` into the user's cache with pinned hashes);
:mod:`synclib.tasks.prompts` renders what each model reads at each turn (the active, passive
and Theory-of-Mind views) and the dialog's rules (how a reply is cut, when a dialog ends).

Modules
-------
``datasets``   datasets fetched into the user's cache (pooch): SOTOPIA, SOTOPIA_HUMAN, fetch, path
``scenarios``  Task, TaskSet, load_tasks, select_tasks, RELATIONSHIPS
``prompts``    render_prompt, masked_prompt, passive_persona, postprocess_reply, is_leave, EMOTIONS, ACTIONS
"""
