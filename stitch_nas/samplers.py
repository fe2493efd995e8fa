"""The Optuna sampler of a search: a built-in name, or ``module:Class`` for any other.

``search.sampler`` (``--sampler``) names one of :data:`SAMPLERS`, each an Optuna sampler that
handles several objectives, or ``package.module:Class`` for any other
:class:`optuna.samplers.BaseSampler` subclass that imports here: your own, another Optuna
sampler, or an OptunaHub sampler you installed or wrapped in a module of your own.
``search.sampler_options`` are keyword arguments of its class; for a built-in name they
replace the defaults below. The search's seed (``search.seed``) is passed as ``seed=`` to every
class that takes one.

The budgets reach a sampler through ``trial.set_constraint`` (Optuna 5's way; each trial
records ``macs``/``params`` minus the budget): the samplers that model constraints read them
from there (TPE, NSGA-II, NSGA-III, GP; see :data:`CONSTRAINED`); QMC and random sampling
ignore them, though an infeasible network is never on the front either way.

:func:`resolve_sampler` is the one place a sampler spec is checked: an unknown name, a module
that does not import, a missing attribute, a class that is not a sampler, or keyword arguments
its class refuses are each one line (:class:`~stitch_nas.errors.ConfigError`). The CLI calls
:func:`check_sampler` before torch or the zoo load; this module imports Optuna only when a
spec needs it.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stitch_nas.errors import ConfigError, shorten

if TYPE_CHECKING:
    import optuna

__all__ = ["CONSTRAINED", "SAMPLERS", "check_sampler", "make_sampler", "resolve_sampler"]

#: the built-in names: Optuna's samplers for several objectives
SAMPLERS = ("tpe", "nsga2", "nsga3", "gp", "qmc", "random")
#: the built-in samplers that read the trials' constraints (the budgets) when they sample
CONSTRAINED = ("tpe", "nsga2", "nsga3", "gp")

#: each built-in name: its class in ``optuna.samplers`` and the keyword arguments it gets
_BUILTIN: dict[str, tuple[str, dict[str, Any]]] = {
    # constant liar: trials in flight (Ray workers) are not proposed twice
    "tpe": ("TPESampler", {"multivariate": True, "constant_liar": True}),
    # a generation of 16 (the default 50 is most of a 50-trial search), or a fifth of the
    # search's trials where make_sampler is told them; a child's parameter mutated (drawn at
    # random) one time in ten: Optuna's default, 1 / (parameters shared by every trial), is 1 in
    # a space whose cut parameters are named per route (pairwise shares only its route), so
    # every child was drawn at random and NSGA-II was random sampling
    "nsga2": ("NSGAIISampler", {"population_size": 16, "mutation_prob": 0.1}),
    "nsga3": ("NSGAIIISampler", {"population_size": 16, "mutation_prob": 0.1}),
    # a search space is conditional (a cut point per model): parameters outside the shared
    # part are sampled at random, which is expected here, not worth a warning per trial
    "gp": ("GPSampler", {"warn_independent_sampling": False}),
    # scrambled, so the seed picks the sequence
    "qmc": ("QMCSampler", {"scramble": True, "warn_independent_sampling": False}),
    "random": ("RandomSampler", {}),
}

_FIX = f"use one of {', '.join(SAMPLERS)}, or package.module:Class for any other"


def _where(spec: str) -> str:
    return f"sampler {shorten(spec)}"


def _builtin_class(name: str) -> type:
    import optuna

    return getattr(optuna.samplers, _BUILTIN[name][0])


def _imported_class(spec: str) -> type:
    """The class ``package.module:Class`` names (``Class`` may be dotted: ``Outer.Inner``)."""
    import optuna

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or ":" in attr:
        raise ConfigError(f"{_where(spec)}: write it as package.module:Class; {_FIX}")
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - whatever the module raises, say it in one line
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise ConfigError(
            f"{_where(spec)}: module {shorten(module_name)} does not import ({why}); install "
            "it, or put its folder on PYTHONPATH"
        ) from None
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ConfigError(
                f"{_where(spec)}: {shorten(module_name)} has no {shorten(attr)}; check the "
                "name after the ':'"
            )
        found = getattr(found, part)
    if not (isinstance(found, type) and issubclass(found, optuna.samplers.BaseSampler)):
        raise ConfigError(
            f"{_where(spec)}: {shorten(attr)} is not a subclass of optuna.samplers.BaseSampler; "
            "name a sampler class"
        )
    return found


def _takes(cls: type, name: str) -> bool:
    """Whether ``cls(name=...)`` is a keyword its constructor names (``**kwargs`` does not)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no signature to read: pass nothing it might refuse
        return False
    param = params.get(name)
    return param is not None and param.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def resolve_sampler(
    spec: str, options: Mapping[str, Any] | None = None
) -> tuple[type, dict[str, Any]]:
    """The sampler class ``spec`` names and the keyword arguments it gets, but ``seed``.

    Args:
        spec: one of :data:`SAMPLERS`, or ``package.module:Class``.
        options: keyword arguments of the class (``search.sampler_options``); for a built-in
            they replace its defaults.

    Raises:
        ConfigError: an unknown name, a module that does not import, a missing attribute, not
            a sampler class, options that are not a mapping, or a keyword the class does
            not take (``seed`` included: it is ``search.seed``).
    """
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"{_where(str(spec))}: give a name; {_FIX}")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(
            f"search.sampler_options={shorten(options)}: give a mapping of keyword arguments "
            "of the sampler's class"
        )
    if spec in _BUILTIN:
        cls, kwargs = _builtin_class(spec), dict(_BUILTIN[spec][1])
    elif ":" in spec:
        cls, kwargs = _imported_class(spec), {}
    else:
        raise ConfigError(f"unknown sampler {shorten(spec)}; {_FIX}")
    given = dict(options or {})
    if "seed" in given:
        raise ConfigError(
            f"search.sampler_options.seed: the seed is search.seed (--seed); remove it from "
            f"the options of {_where(spec)}"
        )
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = None
    if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        named = [k for k, p in params.items() if p.kind in keyword]
        unknown = sorted(str(k) for k in set(given) - set(named))
        if unknown:
            raise ConfigError(
                f"search.sampler_options: {cls.__name__} takes no {unknown[0]!r} "
                f"({_where(spec)}); it takes "
                f"{', '.join(k for k in named if k != 'seed') or 'none but seed'}"
            )
    return cls, {**kwargs, **given}


def population_for(trials: int) -> int:
    """The generation size of ``nsga2`` / ``nsga3`` for a search of ``trials``: five
    generations, at least 8 trials each."""
    return max(8, trials // 5)


def make_sampler(
    name: str,
    seed: int | None,
    options: Mapping[str, Any] | None = None,
    *,
    trials: int | None = None,
) -> optuna.samplers.BaseSampler:
    """The sampler ``name`` (see :func:`resolve_sampler`) with ``options``, seeded with
    ``seed`` where its class takes a seed; ``trials``: the search's, which sets the generation
    size of ``nsga2`` and ``nsga3`` (:func:`population_for`) unless ``options`` sets it.

    Raises:
        ConfigError: as :func:`resolve_sampler`, or the class refused a value of ``options``.
    """
    import optuna

    cls, kwargs = resolve_sampler(name, options)
    if trials and name in ("nsga2", "nsga3") and "population_size" not in (options or {}):
        kwargs["population_size"] = population_for(trials)
    if _takes(cls, "seed"):
        kwargs["seed"] = seed
    try:
        with warnings.catch_warnings():  # QMC, GP...: experimental in name only here
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return cls(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the class's own check of a value: one line
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if not options:
            raise ConfigError(f"{_where(name)} could not be built ({why})") from None
        raise ConfigError(
            f"{_where(name)} with search.sampler_options {shorten(dict(options))} refused "
            f"them ({why}); fix the options"
        ) from None


def check_sampler(name: str, options: Mapping[str, Any] | None = None) -> None:
    """Check the sampler spec before any slow work (builds it once, off the record).

    A built-in name without options needs no import; anything else imports Optuna (and the
    module named), never torch unless that module does.
    """
    if isinstance(name, str) and name in _BUILTIN and not options:
        return
    make_sampler(name, 0, options)
