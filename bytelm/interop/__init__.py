"""Checkpoints in other formats: Hugging Face folders in and out (:mod:`bytelm.interop.hf`), read and
written through :mod:`bytelm.interop.safetensors`."""
