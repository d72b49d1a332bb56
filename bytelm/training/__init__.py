"""The one trainer for every family: mesh and shardings, optimizer, checkpoints, FLOP accounting."""
