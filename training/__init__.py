"""Training the draft methods that read the target's hidden state, for the bundled model.

`python -m training.heads` (Medusa-style heads) and `python -m training.mtp` (a DeepSeek-V3-style
multi-token-prediction module) self-distil from the model's own greedy continuations of
training/prompts.txt (`distill.py`, cached and shared by both), train with what `fit.py` holds,
and write the weights and their manifest entry to assets/. The engine only loads them
(engine/speculative/heads.py); nothing here is imported by the app.
"""
