"""Fine-tuning: the networks of the front trained further, by distillation from a teacher.

SN-Net trains its stitches jointly for tens of epochs and distils from a teacher stronger than
its anchors; DeRy fine-tunes reassembled networks end to end. Here a network of the front is
trained on its own copy of the zoo's fragments (:func:`finetune`) from the zoo's best models
(:func:`make_teacher`), with augmentation, a cosine schedule and early stopping on a held-out
slice of the train split, under one recorded :class:`FinetuneRecipe`; the same recipe applied
to the zoo's own models is the honest control.
"""

from ._augment import Augment, pad_crop_flip
from ._recipe import OPTIMIZERS, TRAINS, FinetuneRecipe
from ._teacher import Teacher, best_models, make_teacher
from ._train import FinetuneReport, distillation_loss, finetune, holdout_rows, trained_parts

__all__ = [
    "Augment",
    "FinetuneRecipe",
    "FinetuneReport",
    "OPTIMIZERS",
    "TRAINS",
    "Teacher",
    "best_models",
    "distillation_loss",
    "finetune",
    "holdout_rows",
    "make_teacher",
    "pad_crop_flip",
    "trained_parts",
]
