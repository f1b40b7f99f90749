"""The recall corpus (issue #40, item 8): real, fixed bugs re-created beside correct twins.

Every case runs the oracle (``refops.testing``) on a re-creation of a bug that TransformerEngine,
torchao, PyTorch or a neighbour shipped, and on its twin, which differs only by the fix. The corpus
measures what the oracle catches; :func:`recall_table` renders the result for
``docs/oracle-recall.md``.
"""

from .cases import RecallCase
from .corpus import ALL_CASES, CaseResult, recall_figures, recall_table, run_corpus

__all__ = ["ALL_CASES", "CaseResult", "RecallCase", "recall_figures", "recall_table", "run_corpus"]
