"""The record every recall case is: a real, fixed bug re-created beside its correct twin."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

TIERS = ("quantizer", "module", "lifecycle")


@dataclasses.dataclass(frozen=True)
class RecallCase:
    """One shipped bug: ``run_bug`` runs the oracle on the re-creation, ``run_twin`` on the fixed twin.

    Both return the oracle's report (anything with ``.ok``). The twin differs from the bug only by the
    fix, so a report that fails the twin is a false alarm of the oracle, not a property of the case.
    """

    name: str
    source_url: str
    tier: str
    summary: str
    run_bug: Callable[[], Any]
    run_twin: Callable[[], Any]
    #: For a bug the oracle misses: True when the bug and its twin do differ, outside the oracle's reach,
    #: so that a miss is the oracle's and not a re-creation that changes nothing.
    shows_defect: Optional[Callable[[], bool]] = None

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"{self.name}: tier must be one of {TIERS}, not {self.tier!r}")
        if not self.source_url.startswith("https://github.com/"):
            raise ValueError(f"{self.name}: source_url must link the fixed issue, PR or commit on GitHub")
