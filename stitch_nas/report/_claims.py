"""What the report may claim: hypervolumes on both splits and domination over zoo models.

**Domination rule.** The search picks its front on validation accuracy, so the report judges it
on the test split only, and allows for the test split's size: a stitched front network
*dominates* a zoo model when

1. it costs no more than the zoo model on every objective other than accuracy (MACs,
   parameters, latency: the search's values; a maximised one such as CKA must be no lower), and
2. the lower end of the 95 % Wilson score interval of its test accuracy is above the zoo model's
   test accuracy (a point estimate).

If (1) holds and the zoo model's test accuracy lies inside the network's interval, the network
*matches it within noise*; above the interval, it is worse. Nothing is claimed without test
figures. Only networks of kind ``"stitched"`` (every model contributes a block of its own:
:func:`~stitch_nas.stitching.network_kind`) make these claims; front networks of another kind
("new head": one model kept whole up to its pooled features with another's head; "new stem")
are judged by the same rule but listed apart, with their kind. Rule (2) treats the zoo model's
accuracy as a point: it asks the network's accuracy to be distinguishable from the zoo
model's measured value, whereas McNemar's paired test on the same images (which needs
per-image correctness) would weigh the noise of both.

The networks judged are those the test pass measured (:func:`~stitch_nas.report.holdout_trials`):
the study's front and the front of its stitched networks alone, both chosen on validation.

**The control.** Where the search's fine-tune stage trained the zoo's front models with the
recipe its networks had (``attrs.FINETUNE_CONTROL``), the claims and the test hypervolumes are
given a second time, against the zoo so trained (``control=True``, ``"test_control"``): a
network trained further beats a zoo model only honestly if it also beats that model trained
as much.

**Hypervolumes** of the zoo's models alone, of the front alone, of front + zoo and of the
stitched networks' own front + zoo (what stitching adds, apart from new heads and stems) are
computed in the normalised box of :func:`~stitch_nas.report.hypervolume_box` (reference point:
accuracy 0 and 1.1 x the largest cost seen), once with validation accuracy (what the search
optimised) and once with test accuracy in place of it (the same networks, the same reference
point).
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from stitch_nas import attrs
from stitch_nas.stitching import STITCHED

from ._holdout import holdout_accuracies, holdout_trials, split_sizes
from ._intervals import wilson_interval
from ._kinds import recorded_kinds, stitched_front, trial_kind
from ._pareto import (
    finite_number,
    hypervolume_box,
    n_fragments,
    normalised_hypervolume,
    objective_names,
    pareto_trials,
    reference_values,
    zoo_references,
)

__all__ = ["DOMINATION_RULE", "control_accuracies", "split_hypervolumes", "zoo_claims"]

DOMINATION_RULE = (
    "a stitched network dominates a zoo model when it costs no more on every other objective "
    "and the lower end of the 95 % Wilson interval of its test accuracy is above the zoo "
    "model's test accuracy; it matches it within noise when that accuracy is inside its interval"
    " (stitched: every model contributes a block of its own; a zoo model with another's head or "
    "stem is listed apart, by its kind)"
)


def _four(
    front: list[list[float]],
    stitched: list[list[float]],
    zoo: list[list[float]],
    study: optuna.Study,
) -> dict[str, float]:
    worst, ideal = hypervolume_box(study)

    def hv(points: list[list[float]]) -> float:
        return normalised_hypervolume(points, study.directions, worst, ideal)

    return {
        "zoo": hv(zoo),
        "front": hv(front),
        "union": hv(front + zoo),
        "stitched_union": hv(stitched + zoo),
    }


def control_accuracies(study: optuna.Study) -> dict[str, float]:
    """Test accuracy of each zoo model the fine-tune stage's control trained, by name."""
    control = study.user_attrs.get(attrs.FINETUNE_CONTROL) or {}
    out = {}
    for name, entry in control.items():
        test = finite_number(entry.get(attrs.TEST_ACCURACY)) if isinstance(entry, dict) else None
        if test is not None:
            out[str(name)] = float(test)
    return out


def _with_test(values: list[float], index: int, test: float) -> list[float]:
    return [test if i == index else v for i, v in enumerate(values)]


def split_hypervolumes(study: optuna.Study) -> dict[str, Any]:
    """Normalised hypervolumes of the zoo alone, the front alone, front + zoo and the stitched
    networks' own front + zoo, per split.

    Returns:
        ``reference_point`` and ``ideal_point`` (raw units), ``val`` and ``test``: each
        ``{"zoo", "front", "union", "stitched_union"}``; ``test`` is None when accuracy is not
        an objective or a measured network or zoo model has no test accuracy;
        ``test_control``: ``test`` with the zoo fine-tuned by the control, where it was
        (None without a control).
    """
    objectives = objective_names(study)
    front, stitched = pareto_trials(study), stitched_front(study)
    refs = [(r, v) for r in zoo_references(study) if (v := reference_values(r, objectives))]
    worst, ideal = hypervolume_box(study)
    out: dict[str, Any] = {"reference_point": worst, "ideal_point": ideal}
    zoo = [v for _, v in refs]
    out["val"] = _four(
        [list(t.values) for t in front], [list(t.values) for t in stitched], zoo, study
    )
    out["test"] = None
    tests = holdout_accuracies(study)
    have = all(t.number in tests for t in front + stitched) and all(
        finite_number(r.get(attrs.TEST_ACCURACY)) is not None for r, _ in refs
    )
    if "accuracy" in objectives and have:
        i = objectives.index("accuracy")

        def on_test(trials: list[FrozenTrial]) -> list[list[float]]:
            return [_with_test(list(t.values), i, tests[t.number]) for t in trials]

        zoo_test = [_with_test(v, i, float(r[attrs.TEST_ACCURACY])) for r, v in refs]
        out["test"] = _four(on_test(front), on_test(stitched), zoo_test, study)
        control = control_accuracies(study)
        if control:
            tuned = [
                _with_test(v, i, control.get(str(r["name"]), float(r[attrs.TEST_ACCURACY])))
                for r, v in refs
            ]
            out["test_control"] = _four(on_test(front), on_test(stitched), tuned, study)
    out.setdefault("test_control", None)
    return out


def _costs_no_more(
    values: list[float], ref: list[float], directions: list[StudyDirection], skip: int
) -> bool:
    for i, (v, r, d) in enumerate(zip(values, ref, directions, strict=True)):
        if i != skip and (v < r if d == StudyDirection.MAXIMIZE else v > r):
            return False
    return True


def zoo_claims(study: optuna.Study, *, control: bool = False) -> list[dict[str, Any]]:
    """For each zoo model, the front networks that dominate or match it on test.

    The rule is the module docstring's (and :data:`DOMINATION_RULE`). With ``control``, each
    zoo model the fine-tune stage's control trained is judged at its fine-tuned test accuracy
    (``"finetuned": True`` in its dict); the others as given.

    Returns:
        One dict per zoo model: ``reference`` (name), ``test_accuracy`` (None if not measured),
        ``dominated_by`` and ``matched_by`` (front trial numbers of kind "stitched", each no
        costlier on every other objective), ``dominated_by_other`` and ``matched_by_other``
        (the same for front networks of other kinds but "zoo model", or of no known kind),
        ``kinds`` (``{"<trial number>": kind or None}`` of every network listed) and
        ``status``: ``"judged"``, ``"no_test"`` (missing test figures), ``"no_accuracy"``
        (accuracy is not an objective) or ``"incomparable"`` (the zoo model lacks an
        objective value).
    """
    objectives, directions = objective_names(study), list(study.directions)
    tests, n_test = holdout_accuracies(study), split_sizes(study).get("test")
    recorded = recorded_kinds(study)
    measured = holdout_trials(study)
    tuned = control_accuracies(study) if control else {}
    kinds = {t.number: trial_kind(t, recorded) for t in measured}
    # a zoo model alone on the front (refitted head aside) is no claim of the search
    judged: list[FrozenTrial] = [
        t for t in measured if n_fragments(t) > 1 or kinds[t.number] == "truncated"
    ]
    out = []
    for ref in zoo_references(study):
        name = str(ref["name"])
        claim: dict[str, Any] = {
            "reference": name,
            attrs.TEST_ACCURACY: tuned.get(name, finite_number(ref.get(attrs.TEST_ACCURACY))),
            "dominated_by": [],
            "matched_by": [],
            "dominated_by_other": [],
            "matched_by_other": [],
            "kinds": {},
            "status": "judged",
        }
        if control:
            claim["finetuned"] = name in tuned
        out.append(claim)
        point, zoo_test = reference_values(ref, objectives), claim[attrs.TEST_ACCURACY]
        if "accuracy" not in objectives:
            claim["status"] = "no_accuracy"
            continue
        if point is None:
            claim["status"] = "incomparable"
            continue
        if zoo_test is None or not n_test or any(t.number not in tests for t in judged):
            claim["status"] = "no_test"
            continue
        acc = objectives.index("accuracy")
        for t in judged:
            if not _costs_no_more(list(t.values), point, directions, acc):
                continue
            low, high = wilson_interval(tests[t.number], int(n_test))
            other = "" if kinds[t.number] == STITCHED else "_other"
            if low > zoo_test:
                claim["dominated_by" + other].append(t.number)
            elif high >= zoo_test:
                claim["matched_by" + other].append(t.number)
            else:
                continue
            claim["kinds"][str(t.number)] = kinds[t.number]
    return out
