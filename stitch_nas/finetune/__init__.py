"""Fine-tuning: the networks of the front trained further, by distillation from a teacher.

SN-Net trains its stitches jointly for tens of epochs and distils from a teacher stronger than
its anchors; DeRy fine-tunes reassembled networks end to end. Here a network of the front is
trained on its own copy of the zoo's fragments (:func:`finetune`) from the zoo's best models
(:func:`make_teacher`), with augmentation, a cosine schedule and early stopping on a held-out
slice of the recipe's ``judge`` split (validation by default), under one recorded
:class:`FinetuneRecipe`; the same recipe applied to the zoo's own models is the honest
control. :func:`finetune_front` is the search's stage.

The recipe imports without torch (the CLI checks it before loading anything); the rest loads
on first use.
"""

from typing import TYPE_CHECKING

from stitch_nas.lazy import lazy_face

from ._recipe import TRAINS, FinetuneRecipe

if TYPE_CHECKING:
    from ._augment import Augment, TimmTrainTransform, pad_crop_flip
    from ._choose import FLOOR_BELOW_BEST, Candidate, candidates, choose
    from ._holdout import holdout_rows, judging_rows
    from ._stage import check_stage, finetune_front
    from ._summary import FinetuneStage, Tuned
    from ._teacher import Teacher, best_models, make_teacher
    from ._train import (
        FinetuneReport,
        distillation_loss,
        finetune,
        holdout_flatters,
        trained_parts,
    )

_LAZY = {
    "Augment": "._augment",
    "pad_crop_flip": "._augment",
    "TimmTrainTransform": "._augment",
    "FinetuneStage": "._summary",
    "Tuned": "._summary",
    "check_stage": "._stage",
    "finetune_front": "._stage",
    "Candidate": "._choose",
    "candidates": "._choose",
    "choose": "._choose",
    "FLOOR_BELOW_BEST": "._choose",
    "Teacher": "._teacher",
    "best_models": "._teacher",
    "make_teacher": "._teacher",
    "FinetuneReport": "._train",
    "distillation_loss": "._train",
    "finetune": "._train",
    "holdout_flatters": "._train",
    "holdout_rows": "._holdout",
    "judging_rows": "._holdout",
    "trained_parts": "._train",
}

__all__ = [
    "FLOOR_BELOW_BEST",
    "Augment",
    "Candidate",
    "FinetuneRecipe",
    "FinetuneReport",
    "FinetuneStage",
    "TRAINS",
    "Teacher",
    "TimmTrainTransform",
    "Tuned",
    "best_models",
    "candidates",
    "check_stage",
    "choose",
    "distillation_loss",
    "finetune",
    "finetune_front",
    "holdout_flatters",
    "holdout_rows",
    "judging_rows",
    "make_teacher",
    "pad_crop_flip",
    "trained_parts",
]

__getattr__, __dir__ = lazy_face(__name__, _LAZY)
