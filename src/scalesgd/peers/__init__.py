"""Other libraries' implementations of what we build, run inside our training loop for side-by-side comparison:
the same data, model, recipe, evaluations and clock (`pip install 'scalesgd[peers]'`; never needed to train)."""
