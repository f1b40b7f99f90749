"""TransformerEngine's ``transformer_engine.common`` names that refops provides: :mod:`refops.common.recipe`.

``from refops.common import recipe`` and ``from refops.common.recipe import DelayedScaling``
read as they do with ``transformer_engine.common``.
"""

from . import recipe

__all__ = ["recipe"]
