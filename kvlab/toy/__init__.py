"""What the small checkpoints trained here are, below both their training (kvlab.train) and their evaluation
(kvlab.hf): the byte-level corpus every Python has (data), their long-context task formats (tasks), the size
presets (sizes) and the V4.1-like architecture (v41, model_type "kvlab_v41", registered with transformers' Auto
classes when imported). kvlab.train re-exports these names (its public API, kvlab/train/__init__.py).

Nothing is imported here: `import kvlab.toy` does not load transformers.
"""
