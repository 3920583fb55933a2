"""Think/act phase: the per-turn classifier, and the global mix with CUSUM detection of its shifts."""
