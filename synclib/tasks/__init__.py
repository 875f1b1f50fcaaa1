"""The social tasks the models play: Sotopia's scenarios and personas, and the prompts built from them.

``datasets``   datasets fetched into the user's cache (pooch, pinned hashes): SOTOPIA, SOTOPIA_HUMAN, fetch, path
``scenarios``  Task, TaskSet, load_tasks, select_tasks, RELATIONSHIPS (the embedded task set or Sotopia's files)
``prompts``    what each model reads at each turn (active, passive, Theory-of-Mind views) and the dialog's rules:
               render_prompt, masked_prompt, passive_persona, postprocess_reply, is_leave, EMOTIONS, ACTIONS
"""
