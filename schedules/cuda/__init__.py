"""Default CUDA schedule rules; `rules.rules()` is their order."""
