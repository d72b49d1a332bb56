"""The one registry of model families: family name -> its task class (and through it, its config
dataclass). :mod:`bytelm.families` registers the built-in families; a family written anywhere
(a test file, another package) joins with :func:`register` and is then found by configs, the
trainer, the evaluator, ``bytelm compare`` and ``bytelm ablate`` and sampling alike. A package can
also name a module that registers its families under the ``bytelm.families`` entry-point group,
which is imported the first time a family is looked up (so that ``bytelm ablate --jobs N`` and
other subprocesses find it too)."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import logging
from typing import TYPE_CHECKING

from bytelm.errors import UserError
from bytelm.models.configs import ModelConfig

if TYPE_CHECKING:
    from bytelm.families.base import Task

log = logging.getLogger(__name__)

FAMILIES: dict[str, type[Task]] = {}
ENTRY_POINT_GROUP = "bytelm.families"
_plugins_loaded = False


def register(task: type[Task]) -> type[Task]:
    """Register ``task`` (usable as a class decorator) under its family's name: the ``family`` field
    default of its ``config_class``, a frozen :class:`~bytelm.models.configs.ModelConfig` dataclass
    (what a ``[model]`` table's ``family = "..."`` reads into). ``task.family`` is set from it (a
    class that names one itself must name the same); ``task.description`` defaults to
    ``"a <family> model"``. Registering the same class again does nothing; another class under a
    taken name is refused."""
    cfg_cls = getattr(task, "config_class", None)
    if not (
        isinstance(cfg_cls, type) and issubclass(cfg_cls, ModelConfig) and dataclasses.is_dataclass(cfg_cls)
    ):
        raise ValueError(f"{task.__name__}: config_class must be a ModelConfig dataclass, got {cfg_cls!r}")
    name = cfg_cls.__dataclass_fields__["family"].default
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(
            f"{task.__name__}: its config_class {cfg_cls.__name__} needs a family field whose default is "
            f"the family's name, of letters, digits, '-' and '_'; got {name!r}"
        )
    own = task.__dict__.get("family")
    if own not in (None, "", name):
        raise ValueError(
            f"family {own!r}: its config_class {cfg_cls.__name__} has family = {name!r}; make them equal"
        )
    if FAMILIES.get(name, task) is not task:
        raise ValueError(
            f"the family name {name!r} is taken by {FAMILIES[name].__module__}.{FAMILIES[name].__name__}"
        )
    task.family = name
    if not task.__dict__.get("description"):
        task.description = f"a {name} model"
    FAMILIES[name] = task
    return task


def _load_plugins() -> None:
    """Import the modules of the ``bytelm.families`` entry points, once (each registers its families)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:  # a broken plugin must not take the built-in families down with it
            log.warning("the bytelm family plugin %s (%s) failed to load: %s", ep.name, ep.value, e)


def task_class(family: str) -> type[Task]:
    """The task class of ``family``; :class:`UserError` naming the known families (and the closest)
    otherwise."""
    if family not in FAMILIES:
        _load_plugins()
    if family not in FAMILIES:
        close = difflib.get_close_matches(family, list(FAMILIES), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UserError(
            f"model.family = {family!r} is not a known family ({', '.join(sorted(FAMILIES))}){hint}"
        )
    return FAMILIES[family]


def config_class(family: str) -> type[ModelConfig]:
    """The ``[model]`` dataclass of ``family``."""
    return task_class(family).config_class


def names() -> list[str]:
    """The registered families, sorted."""
    _load_plugins()
    return sorted(FAMILIES)
