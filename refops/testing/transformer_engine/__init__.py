"""TransformerEngine as a candidate of the oracle: adapters from TE's objects to what each tier takes.

refops' oracle compares a candidate with the reference; these adapters turn
TransformerEngine's objects into candidates, so that checking TE is a few lines:

* quantizer tier: :func:`quantizer_candidate` for ``check_quantizer`` (:func:`te_quantizer`,
  :func:`te_role_quantizer`: TE's quantizer for a refops quantizer or a recipe's role);
* module tier: :func:`candidate_context` (TE's ``autocast`` with TE's recipe) for
  ``compare_modules``, :func:`build_pair` (a TE pipeline and its refops twin with the same values);
* lifecycle tier: :func:`lifecycle_cases` (factories of TE's ops for ``check_lifecycle``);
* :func:`te_recipe`: TE's recipe for a refops recipe.

Importing this package does not import TransformerEngine; the first adapter called does, and
without TE it raises :class:`TransformerEngineUnavailable` naming the install command
(:data:`INSTALL_HINT`). ``python -m refops conformance`` runs every tier against TE
(``docs/conformance.md``).
"""

from .availability import INSTALL_HINT, TransformerEngine, TransformerEngineUnavailable, import_te
from .lifecycle import LIFECYCLE_OPS, WEIGHTED_OPS, LifecycleCase, lifecycle_cases
from .modules import PIPELINES, Pipeline, bit_identical_share, build_pair, candidate_context, copy_values
from .quantizers import ROLES, quantized_fields, quantizer_candidate, te_quantizer, te_role_quantizer
from .recipes import te_recipe

__all__ = [
    "INSTALL_HINT",
    "TransformerEngine",
    "TransformerEngineUnavailable",
    "import_te",
    "te_recipe",
    "te_quantizer",
    "te_role_quantizer",
    "quantizer_candidate",
    "quantized_fields",
    "ROLES",
    "candidate_context",
    "build_pair",
    "copy_values",
    "bit_identical_share",
    "PIPELINES",
    "Pipeline",
    "lifecycle_cases",
    "LifecycleCase",
    "LIFECYCLE_OPS",
    "WEIGHTED_OPS",
]
