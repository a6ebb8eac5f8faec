"""`scalesgd bench …`: measurements against PyTorch's baselines, each a config and a `run` that writes JSON,
Markdown and a PNG (registered as commands in `scalesgd.commands`)."""
