"""Bits-per-byte evaluation on the identical held-out bytes (DESIGN.md section 5)."""
