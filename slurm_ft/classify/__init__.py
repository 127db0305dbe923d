"""Fault classifier: kernel log + job output + exit status + Slurm state -> verdict.

Public interface::

    from slurm_ft.classify import Evidence, Verdict, XidEvent, classify, normalise_bus_id
    verdict = classify(Evidence(kernel_lines=[...], stderr_tail="...", exit_code=1))

The classes, rules and actions are data (``slurm_ft/data/xid_catalog.csv``, ``signatures.toml``,
``classify_policy.toml``), loaded lazily once; admins override them in ``[classify]``
(:mod:`slurm_ft.classify.policy`).  Importing this package loads no data and no click.
See docs/classifier.md.
"""

from slurm_ft.classify.engine import classify
from slurm_ft.classify.model import CLASSES, Evidence, PriorCrash, PriorXid, Verdict, XidEvent
from slurm_ft.classify.parse import normalise_bus_id
from slurm_ft.classify.policy import Policy, default_policy, from_config

__all__ = [
    "CLASSES",
    "Evidence",
    "Policy",
    "PriorCrash",
    "PriorXid",
    "Verdict",
    "XidEvent",
    "classify",
    "default_policy",
    "from_config",
    "normalise_bus_id",
]
