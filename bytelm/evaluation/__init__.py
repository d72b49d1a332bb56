"""Bits-per-byte evaluation on the identical held-out bytes (docs/evaluation.md)."""
