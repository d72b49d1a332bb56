"""Shared fixtures. Tests never touch the user's cache: BYTELM_CACHE_DIR points into a temp dir."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Many tests (and their subprocesses) compile the same tiny models: share compiled executables.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(__file__)), ".pytest_cache", "jax"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# The test models are tiny: compiling them dominates the suite, and LLVM's optimisations buy nothing
# at these sizes (about 30% less wall time on a cold compile cache). Numerics are unchanged in kind:
# the tests compare against references and golden values with tolerances, or within one process.
# XLA:CPU's older elemental emitters compile these small programs about 30% faster again than its
# fusion emitters (a cold suite on 2 cores: 577 -> 394 s, twentieth session); the same programs,
# whose results agree within the tests' tolerances either way.
_OPT_LEVEL, _ELEMENTAL_EMITTERS = "--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"


def _xla_knows(flag: str) -> bool:
    """Whether this jaxlib's XLA has ``flag`` (an unknown flag in XLA_FLAGS aborts the process, and
    jax is not pinned): XLA's table of flags holds each name as a NUL-terminated string in one of
    jaxlib's libraries (a scan of about 0.1 s). The protobuf field of the same name, which outlives
    a retired flag, sits there without the leading NUL, so a miss errs towards "unknown"."""
    import glob
    import importlib.util
    import mmap

    spec = importlib.util.find_spec("jaxlib")
    if spec is None or spec.origin is None:
        return False
    name = b"\0" + flag.lstrip("-").split("=")[0].encode() + b"\0"
    root = os.path.dirname(spec.origin)
    for lib in sorted(
        p for ext in ("so", "dylib", "dll", "pyd") for p in glob.glob(os.path.join(root, f"*.{ext}"))
    ):
        try:
            with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                if m.find(name) >= 0:
                    return True
        except (OSError, ValueError):  # unreadable, or empty (mmap refuses those)
            continue
    return False


def _add_xla_flag(flag: str, *, if_known: bool = False) -> None:
    """Append ``flag`` to XLA_FLAGS unless it is set there already (by the user, or by the parent
    process of an xdist worker); ``if_known``: only if this jaxlib has it (:func:`_xla_knows`)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if flag.split("=")[0] in flags or (if_known and not _xla_knows(flag)):
        return
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()


_add_xla_flag(_OPT_LEVEL)
_add_xla_flag(_ELEMENTAL_EMITTERS, if_known=True)


def _start_jax() -> None:
    """Start JAX's CPU backend now, on its default one device, in every test process (each xdist
    worker). bytelm's CLI asks for one device per core before JAX starts (bytelm/training/host.py),
    so otherwise the first test of a worker to call ``cli.main`` before any JAX computation would give
    the whole worker two devices, and in-process results (a run compared bit for bit with a
    one-device subprocess, a batch of one row) would depend on which tests a worker drew first. Tests
    that need several devices run them in subprocesses (:func:`subprocess_env`)."""
    import jax

    jax.devices()


_start_jax()


def subprocess_env(n_devices: int, **extra: str) -> dict[str, str]:
    """The environment for a JAX subprocess on ``n_devices`` simulated CPU devices (the test flags kept)."""
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f)
    return {
        **os.environ,
        "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={n_devices}",
        "JAX_PLATFORMS": "cpu",
        **extra,
    }


def spawn_two(script: str, *args, devices: int = 1, env_of=lambda pid: {}) -> list[subprocess.Popen]:
    """``script`` as process 0 and process 1 of a job on a fresh localhost port: its ``argv`` is the
    port, the process index and ``args``; ``devices`` simulated CPU devices each (``env_of(pid)``:
    more environment)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [
        subprocess.Popen(
            [sys.executable, "-c", script, str(port), str(pid), *map(str, args)],
            env=subprocess_env(devices, **env_of(pid)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(2)
    ]


def finished(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[str, str]]:
    """Each process's ``(stdout, stderr)`` once all have exited, every one with status 0."""
    outs = [p.communicate(timeout=timeout) for p in procs]
    for pid, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"process {pid} failed:\n{out[-2000:]}\n{err[-4000:]}"
    return outs


TESTS_DIR = os.path.dirname(os.path.abspath(__file__))  # for subprocesses that import param_gap


def param_gap(got, want, init) -> tuple[float, float]:
    """Two runs' parameters (lists of arrays) after the same steps from ``init``: the largest
    difference, and the difference's norm over the norm of the update ``want`` made.

    Differently sharded programs sum in another order (float32 reassociation, ~1e-7 relative), and
    Adam divides each gradient by its own scale, so a coordinate whose gradient is almost zero can
    move by a visible fraction of the learning rate: the largest difference depends on the CPU's
    code (2.6e-5 seen on an AMD EPYC, under 1e-5 on Intel Xeons). A sharding error changes the
    update itself, so parity is checked on the relative norm (at most 6.2e-5 seen; a wrong
    reduction or placement gives the order of 1)."""
    d = [np.asarray(a) - np.asarray(b) for a, b in zip(got, want)]
    moved = [np.asarray(b) - i for b, i in zip(want, init)]
    worst = max(float(np.max(np.abs(x))) for x in d)
    return worst, float(np.sqrt(sum(np.sum(x * x) for x in d) / sum(np.sum(x * x) for x in moved)))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BYTELM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "bytelm-cache"))


def write_files(root, files: dict[str, bytes]):
    """Create ``files`` (relative path -> bytes) under ``root``; return ``root``."""
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def text_dir_files() -> dict[str, bytes]:
    """40 documents in two language directories (``en/``, ``de/``; CRLF line ends in German)."""
    files = {}
    for i in range(20):
        files[f"en/doc{i:02d}.txt"] = (
            f"Document {i}. The quick brown fox jumps over the lazy dog.\n" * (i + 1)
        ).encode()
        files[f"de/doc{i:02d}.txt"] = (
            f"Dokument {i}: Zwölf Boxkämpfer jagen Viktor quer über den Sylter Deich.\r\n" * (i + 2)
        ).encode()
    return files


@pytest.fixture
def text_dir(tmp_path):
    """A small directory corpus of 40 documents in two language directories."""
    return write_files(tmp_path / "corpus", text_dir_files())


# Characters both regex engines class alike (Python's `regex` and HF tokenizers' Rust one know different
# Unicode versions: a letter added lately, U+A7D2 in Unicode 14, is \p{L} to one and unassigned to the
# other, so their pre-tokenizers split it differently before any model runs): the Basic Multilingual
# Plane's characters assigned by Unicode 3.2, whose classes the later versions keep.
STABLE_CODEPOINTS = [
    c
    for c in range(0xFFFF + 1)
    if not 0xD800 <= c <= 0xDFFF and unicodedata.ucd_3_2_0.category(chr(c)) not in ("Cn", "Cs")
]


def stable_text(max_size: int):
    """Hypothesis text of :data:`STABLE_CODEPOINTS` (random text that HF's parity can speak for)."""
    from hypothesis import strategies as st

    return st.text(st.sampled_from([chr(c) for c in STABLE_CODEPOINTS]), max_size=max_size)


WORDS = "the of and to in is that for it as with was on be by this are from at or an which not".split()


def word_corpus(root, *, n_docs: int = 60, words_per_doc: int = 300, two_dirs: bool = False):
    """A deterministic corpus of random common English words (seed 0) under ``root``; with
    ``two_dirs`` the documents alternate between ``de/`` and ``en/`` (groups for breakdowns)."""
    rng = np.random.default_rng(0)
    files = {}
    for i in range(n_docs):
        words = rng.choice(WORDS, size=words_per_doc)
        name = f"{'en' if i % 2 else 'de'}/d{i:02d}.txt" if two_dirs else f"d{i:02d}.txt"
        files[name] = (" ".join(words) + ".\n").encode()
    return write_files(root, files)


# The longest tests start first, so that two workers (pytest -n auto on 2 cores) are not left with
# one of them at the end: the suite's wall time is the busier worker's. Order otherwise unchanged.
_LONGEST_FIRST = (
    "test_ablate.py::test_micro_grid_end_to_end",  # the micro grid, trained once (one test: see there)
    "test_sharding.py::test_every_family_sharded_equals_one_device",
    "test_compare.py",
    "test_multihost.py::test_two_processes_agree",  # two processes of two devices each, and one
    "test_muon.py::test_data_parallel_devices_share_the_newton_schulz_work",  # a subprocess of 2 devices
    "test_training.py::test_resume_after_sigkill_equals_uninterrupted",
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        return next((i for i, key in enumerate(_LONGEST_FIRST) if key in item.nodeid), len(_LONGEST_FIRST))

    items.sort(key=rank)  # stable: the collection order within a rank


# The settings and the smallest model of every family (a window of 64): batch invariance, conditional scoring
TINY_COMMON = {
    "data.segment_bytes": 48,
    "data.max_eval_bytes": 2400,
    "data.heldout_fraction": 0.2,
    "train.batch_size": 4,
    "train.seq_len": 64,
    "train.steps": 2,
    "train.warmup_steps": 1,
    "train.log_every": 1,
    "train.checkpoint_every": 100,
    "train.peak_flops": 1e11,
    "eval.every": 0,
    "eval.batch_size": 4,
}


TINY_FAMILIES = {
    "mambabyte": {
        "model.family": "mambabyte",
        "model.d_model": 32,
        "model.n_layers": 1,
        "model.d_state": 8,
        "model.head_dim": 16,
        "model.chunk": 16,
    },
    "byte": {
        "model.family": "byte",
        "model.d_model": 32,
        "model.n_layers": 1,
        "model.n_heads": 2,
        "model.mlp_dim": 64,
    },
    "bpe": {
        "model.family": "bpe",
        "model.d_model": 32,
        "model.n_layers": 1,
        "model.n_heads": 2,
        "model.mlp_dim": 64,
    },
    "megabyte": {
        "model.family": "megabyte",
        "model.patch_size": 4,
        "model.embed_dim": 8,
        "model.global.d_model": 32,
        "model.global.layers": 1,
        "model.global.heads": 2,
        "model.global.mlp_dim": 64,
        "model.local.d_model": 32,
        "model.local.layers": 1,
        "model.local.heads": 2,
        "model.local.mlp_dim": 64,
    },
    "blt": {
        "model.family": "blt",
        "model.target_patch_len": 3.0,
        "model.local.d_model": 32,
        "model.local.heads": 2,
        "model.local.mlp_dim": 64,
        "model.local.window": 16,
        "model.global.d_model": 32,
        "model.global.heads": 2,
        "model.global.mlp_dim": 64,
        "model.global.layers": 1,
        "model.hash_table_size": 257,
        "model.ngram_sizes": "3,4",
        "model.max_patches": 65,
    },
    "hnet": {
        "model.family": "hnet",
        "model.local.d_model": 32,
        "model.local.heads": 2,
        "model.local.mlp_dim": 64,
        "model.local.encoder": "m1",
        "model.local.decoder": "m1",
        "model.local.window": 16,
        "model.ssm.d_state": 8,
        "model.ssm.head_dim": 16,
        "model.ssm.chunk": 16,
        "model.global.d_model": 48,
        "model.global.layers": 1,
        "model.global.heads": 2,
        "model.global.mlp_dim": 64,
        "model.target_chunk_len": 3.0,
        "model.chunk_slots": 1.0,  # (windows overflow: the slot rule must not depend on the batch either)
    },
}


def tiny_family(family: str, artefacts) -> dict:
    """``TINY_FAMILIES[family]`` with what the family needs from ``artefacts`` (a folder holding a BPE
    tokenizer in ``tokenizer/`` and an entropy-model run in ``entropy/``)."""
    extra = dict(TINY_FAMILIES[family])
    if family == "bpe":
        extra["model.tokenizer"] = artefacts / "tokenizer"
    if family == "blt":
        extra["model.entropy_run"] = artefacts / "entropy"
    return extra
