"""Routing of extra tensors between the basic ops of one fuser.

A basic op may take extra inputs (after the main input) and produce extra
outputs. Unbound extra inputs are public arguments of the fuser, in (op, slot)
order. An extra output is returned to the caller unless hidden. A named channel
connects an extra output to extra inputs of *later* ops in the same fuser: the
bound inputs disappear from the fuser's signature, and in backward the
consumers' grads flow back to the producer.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .op import BasicOperation

__all__ = ["ChannelRouting", "resolve_channels"]

Slot = tuple[int, int]  # (basic op index, slot index)


@dataclasses.dataclass(frozen=True)
class ChannelRouting:
    """Who feeds whom, fixed when a fuser is built."""

    #: Public extra-input slots, in the order the caller passes them.
    external_extra_input_slots: list[Slot]
    #: ``sources[op][slot]``: the producing (op, slot) of a bound input, or None if public.
    extra_input_sources: list[list[Slot | None]]
    #: ``consumers[op][slot]``: every (op, slot) that consumes this extra output.
    extra_output_consumers: list[list[list[Slot]]]
    #: Extra-output slots returned to the caller, in order.
    public_extra_output_slots: list[Slot]

    @property
    def num_extra_inputs(self) -> int:
        return len(self.external_extra_input_slots)


def resolve_channels(basic_ops: Sequence[BasicOperation]) -> ChannelRouting:
    """Check the channel names of ``basic_ops`` and build their routing.

    Raises ValueError when a channel has several producers, no producer, or a
    producer that does not come earlier than a consumer.
    """
    producers: dict[str, Slot] = {}
    for i, op in enumerate(basic_ops):
        for s, name in enumerate(op._extra_output_channels):
            if name is None:
                continue
            if name in producers:
                raise ValueError(
                    f"extra tensor channel {name!r} has multiple producers: op {producers[name][0]} "
                    f"({type(basic_ops[producers[name][0]]).__name__}) and op {i} ({type(op).__name__})"
                )
            producers[name] = (i, s)

    external: list[Slot] = []
    sources: list[list[Slot | None]] = []
    consumers: list[list[list[Slot]]] = [[[] for _ in range(op.num_extra_outputs)] for op in basic_ops]
    for i, op in enumerate(basic_ops):
        row: list[Slot | None] = []
        for s, name in enumerate(op._extra_input_channels):
            if name is None:
                row.append(None)
                external.append((i, s))
                continue
            if name not in producers:
                raise ValueError(
                    f"extra tensor channel {name!r} (input {s} of op {i}, {type(op).__name__}) has no producer "
                    "in this fuser"
                )
            producer = producers[name]
            if producer[0] >= i:
                raise ValueError(
                    f"extra tensor channel {name!r} (input {s} of op {i}, {type(op).__name__}) has no earlier "
                    f"producer: it is produced by op {producer[0]}"
                )
            row.append(producer)
            consumers[producer[0]][producer[1]].append((i, s))
        sources.append(row)

    public = [
        (i, s) for i, op in enumerate(basic_ops) for s in range(op.num_extra_outputs) if op._extra_output_to_caller[s]
    ]
    return ChannelRouting(external, sources, consumers, public)
