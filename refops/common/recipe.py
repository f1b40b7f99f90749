"""``refops.common.recipe``: the recipes under TransformerEngine's module path (``transformer_engine.common.recipe``).

The same objects as :mod:`refops.recipe` (``refops.common.recipe.DelayedScaling is
refops.recipe.DelayedScaling``), so ``isinstance`` checks and recipe predicates
agree whichever path a user imports from.
"""

from ..recipe import *  # noqa: F401,F403
from ..recipe import __all__  # noqa: F401
