"""The FSDP2 names ``docs/distributed.md`` documented here before the sharding layer: re-exported from their homes.

``reset_parameter_owners`` lives in :mod:`refops.sharding.parameter_owners`, ``PER_OP_SHARDING_FIX`` in
:mod:`refops.ops.dtensor_parameters` (the fuser's refusal that quotes it).
"""

from __future__ import annotations

from ..ops.dtensor_parameters import PER_OP_SHARDING_FIX
from ..sharding.parameter_owners import reset_parameter_owners

__all__ = ["PER_OP_SHARDING_FIX", "reset_parameter_owners"]
