"""Experiments built from the library's stages: :mod:`bytelm.experiments.compare` (the main job:
every family at a matched budget, scored on the identical held-out bytes)."""
