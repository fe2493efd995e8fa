"""What the fine-tune stage did: the networks it trained, and the one line it prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._train import FinetuneReport, holdout_flatters

__all__ = ["FinetuneStage", "Tuned"]


@dataclass(frozen=True)
class Tuned:
    """One network the stage trained: ``source`` is a trial number or a zoo model's name."""

    source: int | str
    before: float  #: validation accuracy it started from
    after: float  #: validation accuracy of the weights kept
    report: FinetuneReport
    trial: int | None = None  #: the trial that records it (None: a control zoo model)


@dataclass
class FinetuneStage:
    """What :func:`finetune_front` did."""

    networks: list[Tuned] = field(default_factory=list)
    control: list[Tuned] = field(default_factory=list)
    already: int = 0  #: networks fine-tuned with this recipe before (``--resume``)
    teacher: str = ""
    seconds: float = 0.0
    val_images: int = 0  #: the validation split's size, for the intervals of ``before``

    def describe(self) -> str:
        """A line for the terminal, then one per network: what its training cost and bought."""
        if not self.networks and not self.control:
            if self.already:
                return f"fine-tune: all {self.already} chosen networks already fine-tuned"
            return "fine-tune: no stitched network on the front to fine-tune"
        trained = self.networks + self.control
        judges = sorted({_judge(t.report) for t in trained})
        line = (
            f"fine-tuned {len(self.networks)} network(s) and {len(self.control)} control zoo "
            f"model(s) from {self.teacher} in {self.seconds:.1f} s, each epoch judged on "
            f"{' / '.join(judges)}; validation accuracy before -> after:"
        )
        for t in self.networks:
            line += "\n  " + _row(t)
        for t in self.control:
            line += "\n  control " + _row(t)
        flattered = [
            t
            for t in trained
            if t.report.judged_on == "train"  # a slice of the images the zoo trained on
            and t.report.recipe.get("keep", "best") == "best"  # the slice chose what was kept
            and holdout_flatters(t.report, t.before, self.val_images)
        ]
        if flattered:  # say why "kept its weights" may not mean "training could not help"
            line += (
                f"\n  the held-out slice of the train split scored {len(flattered)} of "
                f"{len(trained)} starting networks above their validation interval (e.g. "
                f"{_name(flattered[0].source)} {flattered[0].report.initial_holdout:.4f} "
                f"against {flattered[0].before:.4f}), as when the zoo was trained on those "
                "images: it then favours the starting weights (finetune.recipe.judge: val "
                "judges on the validation split instead), and the test pass is the judge"
            )
        return line


def _name(source: int | str) -> str:
    return f"#{source}" if isinstance(source, int) else str(source)


def _judge(report: FinetuneReport) -> str:
    split = "validation" if report.judged_on == "val" else "train"
    return f"{report.holdout_images} {split} images"


def _row(t: Tuned) -> str:
    """One network's line: accuracy before and after, epochs, seconds, what was kept."""
    r = t.report
    kept = "kept its starting weights" if r.kept_start else f"kept epoch {r.best_epoch}"
    why = {"unmoved": ", the first epoch did not move it", "diverged": ", the loss diverged"}
    return (
        f"{_name(t.source)} {t.before:.4f} -> {t.after:.4f}: {r.epochs} epoch(s), "
        f"{r.seconds:.1f} s, {kept}{why.get(r.stopped, '')}"
    )
