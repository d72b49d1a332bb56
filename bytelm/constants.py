"""Byte-id constants shared by the whole package (docs/architecture.md, Byte ids).

A byte ``b`` (0..255) has id ``b + BYTE_OFFSET``; ids below the offset are control ids.
"""

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
SEP_ID = 3
BYTE_OFFSET = 4
NUM_BYTE_IDS = 256 + BYTE_OFFSET  # 260 valid ids; embedding tables pad this up (see models)
