"""The names of everything stitch_nas stores on an Optuna study and its trials.

Trial user attributes are JSON, readable in optuna-dashboard and by ``stitch-nas report`` /
``export`` in another process, so their names are part of the published format: write and read
them through these constants only.
"""

from __future__ import annotations

__all__ = [
    "ARTIFACTS",
    "BUDGETS",
    "CKA",
    "CONFIG",
    "DESCRIBE",
    "DUPLICATE_OF",
    "FAIL_REASON",
    "FINETUNED",
    "FINETUNES",
    "FINETUNE_CONTROL",
    "KIND",
    "KINDS",
    "MODELS",
    "OBJECTIVES",
    "PARTIAL_ACCURACY",
    "PARTIAL_INTERVAL",
    "PHASES",
    "PROBE_ACCURACY",
    "PROXY_PROPOSALS",
    "PRUNE_REASON",
    "RAY_NODE",
    "RAY_WORKER",
    "REFERENCES",
    "REFERENCE_OF",
    "REFINES",
    "SETTINGS",
    "SLICE_IMAGES",
    "SPACE",
    "SPLIT_SIZES",
    "TEST_ACCURACY",
    "TEST_RESULTS",
    "WEIGHTS",
]

# --- on each trial ---
#: the sampled StitchConfig, as ``StitchConfig.to_dict()``
CONFIG = "config"
#: one readable line for the config (``StitchConfig.describe()``)
DESCRIBE = "describe"
#: the zoo models the config uses, in order
MODELS = "models"
#: a repeat of an earlier trial's config: that trial's number (the repeat is PRUNED, not refitted)
DUPLICATE_OF = "duplicate_of"
#: a zoo model on its own, measured once as a reference: its name (the trial is PRUNED)
REFERENCE_OF = "reference_of"
#: a refinement (search._refine): the number of the least-squares trial it retrains
REFINES = "refines"
#: a fine-tuned network (``stitch_nas.finetune``): the number of the trial it trained further
#: (same config, same costs; only its weights and accuracy differ)
FINETUNES = "finetunes"
#: ... what trained it: ``{"recipe": FinetuneRecipe.to_dict(), "report": FinetuneReport}``
FINETUNED = "finetuned"
#: ... and its weights: a safetensors file, relative to the search's folder (the config alone
#: rebuilds the network it started from, not the one it became). A trial with trained
#: adapters names one too, ``trained/trial_<n>_<digest>.safetensors``: the tensors training
#: made, so its network is rebuilt without training again (``stitching.load_tuned``)
WEIGHTS = "weights"
#: the config's CKA chain score on the probe split
CKA = "cka"
#: why a PRUNED trial was pruned
PRUNE_REASON = "prune_reason"
#: the least-squares version's accuracy on the probe split (the pruning and seeding proxy)
PROBE_ACCURACY = "probe_accuracy"
#: the params of the proposals the probe scored to choose this trial's (``search.proxy_candidates``;
#: the chosen one among them), so what the choice cost can be counted after the search
PROXY_PROPOSALS = "proxy_proposals"
#: the network's kind ("stitched", "new head", ...: ``stitch_nas.stitching.network_kind``), the
#: ``Measurement`` field of that name; trials of older versions lack it
KIND = "kind"
#: why a FAIL trial failed
FAIL_REASON = "fail_reason"
#: a trial pruned by multi-fidelity evaluation: its accuracy on the slices it was scored on,
PARTIAL_ACCURACY = "partial_accuracy"
#: the number of images in them,
SLICE_IMAGES = "slice_images"
#: and the 95 % Wilson interval ``[low, high]`` of that accuracy
PARTIAL_INTERVAL = "partial_accuracy_interval"
#: a trial run on Ray: the id of the Ray node it ran on
RAY_NODE = "ray_node"
#: ... and, where a Ray worker asked the study for it itself, that worker's id in its search
#: (``<run>-<slot>-<start>``): a dead worker's trials are failed by it
RAY_WORKER = "ray_worker"
# The measured figures are stored under the field names of ``stitch_nas.Measurement``.

# --- on the study ---
#: ``{"<export folder name>": artifact id}`` of exported networks uploaded to an Optuna artifact
#: store (``trial_12``, ``elastic``). They are artifacts of the study, each named after its
#: folder, because Optuna refuses to change a finished trial.
ARTIFACTS = "artifacts"
#: the objective names, in the order of ``trial.values``
OBJECTIVES = "objectives"
#: the search space's name
SPACE = "space"
#: ``{"macs": ..., "params": ...}`` budgets, enforced as constraints
BUDGETS = "budgets"
#: the zoo's own models measured like trials: a list of dicts with a "name"
REFERENCES = "references"
#: ``{"<phase>": {"seconds": wall seconds, "peak_rss_gb": the process's peak so far}}`` of the
#: latest run of the whole pipeline on this study (a resumed run replaces it), in phase order
PHASES = "phases"
#: the CLI settings the search ran with (what ``stitch-nas export`` rebuilds the zoo from)
SETTINGS = "settings"
#: ``{"data": name, "val": n_images, "test": n_images}``: what accuracy intervals are computed on
SPLIT_SIZES = "split_sizes"
#: ``{"<trial number>": test accuracy}`` of the front's networks, measured after the search on the
#: test split that no choice used. It lives on the study because Optuna refuses to change a
#: finished trial's user attributes.
TEST_RESULTS = "test_results"
#: ``{"<trial number>": kind}`` of front networks whose trials lack ``KIND`` (measured by an older
#: version), recorded by the test pass, which has the zoo to work the kinds out
KINDS = "kinds"
#: the honest control of the fine-tune stage: the zoo's front models fine-tuned with the same
#: recipe, ``{name: {"accuracy": val, "test_accuracy": test, "finetuned": {...}}}``
FINETUNE_CONTROL = "finetune_control"
#: a zoo reference's accuracy on the test split (a key of each ``REFERENCES`` dict); also the
#: field name in ``pareto.json``, ``trials.csv`` and an export's ``meta.json``
TEST_ACCURACY = "test_accuracy"
