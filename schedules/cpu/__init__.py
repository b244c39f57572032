"""Default llvm (CPU) schedule rules, one per file; `rules.RULES` is their order."""
