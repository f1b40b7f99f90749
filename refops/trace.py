"""Lifecycle events, recorded from the real code paths.

Every lifecycle step in :mod:`refops.ops` calls :func:`record` with the kind of
event and what it acted on. Nothing is stored unless a :class:`trace` context is
active, so recording costs one truthiness check on the hot path.

Example::

    with refops.trace() as t:
        model(x).sum().backward()
    # each op named by its path in the model
    print(t.render_text(instance_names(model)))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

__all__ = ["Event", "EVENT_KINDS", "trace", "record", "is_tracing", "instance_names", "recipe_name"]

#: Every event kind the library emits, in the order they first occur in a
#: typical training step. The docs and the trace renderer rely on this list.
EVENT_KINDS: dict[str, str] = {
    "construct": "an op was constructed (device, dtype, deferred or not)",
    "recipe_state": "an op's recipe state (quantizers) was reset for a recipe",
    "first_forward_hook": "pre_first_fuser_forward ran on a top-level op",
    "quantize_weight": "a weight built under quantized_model_init became a quantized tensor",
    "materialize": "a parameter received its storage and initial values",
    "alias_sync": "a container re-pointed its aliases at its basic ops' parameters",
    "cache_refresh": "the fuser rebuilt its parameter cache (and why)",
    "backward_selection": "the fuser chose the first op that needs backward",
    "fusion_plan": "the fuser chose its forward and backward op lists",
    "forward_op": "an op (basic or fused) ran forward",
    "backward_op": "an op (basic or fused) ran backward",
    "fused_quantize": "an activation's fp32 result was quantized unrounded (TE's fused activation + quantize)",
    "scale_update": "delayed-scaling amax history and scales were updated",
    "checkpoint": "state was saved to or loaded from a state dict",
}


@dataclasses.dataclass(frozen=True)
class Event:
    """One lifecycle event: what happened (``kind``), to what (``subject``), and details.

    ``instance`` tells apart two objects of one class (the two ``BasicLinear`` of an MLP):
    ``id()`` of the op the event is about, or None. It is not part of the event's value
    (two runs of one model give equal events); :meth:`trace.render_text` shows it as the
    ``op=`` label (:meth:`trace.instance_labels`), and the Mermaid rendering draws one
    lifeline per instance.
    """

    kind: str
    subject: str
    details: dict[str, Any]
    instance: Optional[int] = dataclasses.field(default=None, compare=False, repr=False)

    def describe(self, op: Optional[str] = None) -> str:
        """One line: the kind, the subject and the details, led by ``op=<op>`` when the op's label is given."""
        fields = ([f"op={op}"] if op else []) + [f"{k}={_fmt(v)}" for k, v in self.details.items()]
        extra = ", ".join(fields)
        return f"{self.kind:<18} {self.subject}" + (f"  ({extra})" if extra else "")

    def __str__(self) -> str:
        return self.describe()


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def recipe_name(recipe: Any) -> str:
    """How events name a recipe: its class name (``DelayedScaling``), or ``"none"`` for high precision."""
    return "none" if recipe is None else type(recipe).__name__


def instance_names(module: Any) -> dict[int, str]:
    """``{id(op): its path in module}`` for every submodule, e.g. ``"1.basic_ops.0"`` for the ``BasicLinear`` of
    a Sequential's second op: the name ``module.get_submodule`` takes. For :meth:`trace.render_text`."""
    return {id(m): name for name, m in module.named_modules() if name}


_active: list["trace"] = []


def is_tracing() -> bool:
    """True while at least one :class:`trace` context is recording."""
    return bool(_active)


def record(kind: str, subject: str, *, instance: object = None, **details: Any) -> None:
    """Append an event to every active trace. A no-op when nothing is tracing.

    ``instance``: the op the event is about (its ``id()`` is kept, so that two ops of one
    class get two lifelines in :meth:`trace.render_mermaid`).
    """
    if not _active:
        return
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown trace event kind {kind!r}; known kinds: {sorted(EVENT_KINDS)}")
    event = Event(kind, subject, dict(details), None if instance is None else id(instance))
    for t in _active:
        if t.kinds is None or kind in t.kinds:
            t.events.append(event)


class trace:
    """Context manager that records lifecycle events.

    Args:
        kinds: record only these event kinds (default: all of :data:`EVENT_KINDS`).
    """

    def __init__(self, kinds: list[str] | None = None) -> None:
        if kinds is not None:
            unknown = set(kinds) - set(EVENT_KINDS)
            if unknown:
                raise ValueError(f"unknown trace event kinds {sorted(unknown)}")
        self.kinds = None if kinds is None else set(kinds)
        self.events: list[Event] = []

    def __enter__(self) -> "trace":
        _active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _active.remove(self)

    def of_kind(self, kind: str) -> list[Event]:
        """The recorded events of one kind, in order."""
        return [e for e in self.events if e.kind == kind]

    def instance_labels(self, names: Optional[Mapping[int, str]] = None) -> dict[int, str]:
        """A label for each op instance the events name, so that two ops of one class can be told apart.

        An instance in ``names`` (``id(op) -> name``, such as :func:`instance_names` of the model) is labelled
        with its name. Any other instance of a class with several instances in this trace is numbered in order
        of appearance, ``"BasicLinear 1"``, ``"BasicLinear 2"`` (as :meth:`render_mermaid` names its lifelines);
        the only instance of its class needs no label and gets none.
        """
        names = names or {}
        seen: dict[str, list[int]] = {}  # class -> unnamed instances, in order of appearance
        for e in self.events:
            if e.instance is not None and e.instance not in names:
                owner = e.subject.partition(".")[0]
                instances = seen.setdefault(owner, [])
                if e.instance not in instances:
                    instances.append(e.instance)
        labels = {i: f"{owner} {n}" for owner, instances in seen.items() if len(instances) > 1
                  for n, i in enumerate(instances, 1)}
        used = {e.instance for e in self.events}
        return {**labels, **{i: name for i, name in names.items() if i in used}}

    def lines(self, names: Optional[Mapping[int, str]] = None) -> list[str]:
        """One line per event (:meth:`Event.describe`), each op labelled by :meth:`instance_labels`."""
        labels = self.instance_labels(names)
        return [e.describe(labels.get(e.instance)) for e in self.events]

    def render_text(self, names: Optional[Mapping[int, str]] = None) -> str:
        """One line per event, numbered; ``names`` as for :meth:`instance_labels`."""
        return "\n".join(f"{i:3d}. {line}" for i, line in enumerate(self.lines(names), 1))

    #: Words a Mermaid sequence diagram reserves, and the ids of the renderer's own participants.
    _MERMAID_KEYWORDS = frozenset({
        "end", "participant", "actor", "as", "loop", "alt", "else", "opt", "par", "and", "rect", "critical",
        "break", "note", "over", "box", "create", "destroy", "activate", "deactivate", "autonumber", "title",
        "links", "link", "properties", "details", "user", "fuser", "autograd",
    })
    #: Punctuation allowed in labels: nothing Mermaid reads as syntax (no ``;``, ``#``, angle brackets, braces).
    _MERMAID_SAFE_PUNCTUATION = " _.,()[]=+-/:"

    def render_mermaid(self) -> str:
        """The events as a Mermaid ``sequenceDiagram``, one arrow per event.

        The participants are ``User``, ``Fuser`` (the ``OperationFuser``), every op
        that appears in the events, and ``Autograd``. Each op *instance* has its own
        lifeline: a class with one instance is drawn under its name (``GELU``), the
        instances of a class with several are numbered in order of appearance
        (``BasicLinear 1``, ``BasicLinear 2``). A fusion plan also gets a note over the
        fuser listing the forward and backward op lists. Participant ids are valid
        Mermaid identifiers and labels contain no Mermaid syntax, so the output renders
        as is, for example with ``sphinxcontrib-mermaid``.

        Returns:
            The diagram source, one statement per line.

        Raises:
            ValueError: an event's kind is not one of :data:`EVENT_KINDS`.
        """
        arrows = [self._mermaid_arrow(event) for event in self.events]
        instances: dict[str, list[Optional[int]]] = {}  # op class -> its instances, in order of appearance
        for event, (sender, receiver, _, _) in zip(self.events, arrows):
            for name in (sender, receiver):
                if name.startswith("op:"):
                    seen = instances.setdefault(name, [])
                    if event.instance is not None and event.instance not in seen:
                        seen.append(event.instance)
        # An event that names no instance joins its class's lifeline when the class has one; among
        # several it cannot be placed, and gets a lifeline of its own.
        anonymous = {name for event, arrow in zip(self.events, arrows) for name in arrow[:2]
                     if name.startswith("op:") and event.instance is None}
        for name in anonymous:
            if len(instances[name]) > 1:
                instances[name].append(None)
        ids = {"User": "User", "Fuser": "Fuser", "Autograd": "Autograd"}
        lines = ["sequenceDiagram", "    participant User", "    participant Fuser as OperationFuser"]

        def lifeline(name: str, instance: Optional[int]) -> str:
            if not name.startswith("op:"):
                return ids[name]
            if instance is None and len(instances[name]) == 1:
                instance = instances[name][0]
            key = f"{name}#{instance}"
            if key not in ids:
                op = name.removeprefix("op:")
                known = instances[name] or [None]
                label = f"{op} {known.index(instance) + 1}" if len(known) > 1 else op
                ids[key] = self._mermaid_id(label.replace(" ", "_"), taken=set(ids.values()))
                shown = self._mermaid_text(label)
                alias = "" if ids[key] == label or not shown else f" as {shown}"
                lines.append(f"    participant {ids[key]}{alias}")
            return ids[key]

        body = []
        for event, (sender, receiver, label, note) in zip(self.events, arrows):
            src, dst = lifeline(sender, event.instance), lifeline(receiver, event.instance)
            body.append(f"    {src}->>{dst}: {self._mermaid_text(label)}")
            if note is not None:
                body.append(f"    Note over {dst}: {self._mermaid_text(note)}")
        return "\n".join([*lines, "    participant Autograd", *body])

    @staticmethod
    def _mermaid_arrow(event: Event) -> tuple[str, str, str, str | None]:
        """``(sender, receiver, label, note)`` for one event.

        Senders and receivers are ``"User"``, ``"Fuser"``, ``"Autograd"`` or ``"op:<class name>"``.
        """
        if event.kind not in EVENT_KINDS:
            raise ValueError(f"cannot render trace event kind {event.kind!r}; known kinds: {sorted(EVENT_KINDS)}")
        d = event.details
        owner, _, member = event.subject.partition(".")
        owner = f"op:{owner}"
        dtype = str(d.get("dtype", "")).removeprefix("torch.")
        if event.kind == "construct":
            deferred = ", deferred" if d.get("deferred") else ""
            return "User", owner, f"construct on {d.get('device')} ({dtype}{deferred})", None
        if event.kind == "recipe_state":
            return "Fuser", owner, f"reset_recipe_state({d.get('recipe')})", None
        if event.kind == "first_forward_hook":
            return "Fuser", owner, "pre_first_fuser_forward()", None
        if event.kind == "materialize":
            identity = "same object" if d.get("kept_identity") else "new object"
            return owner, owner, f"materialize {member} on {d.get('device')} ({dtype}, {identity})", None
        if event.kind == "quantize_weight":
            usages = ", ".join(d.get("usages", []))
            return owner, owner, f"quantize {member} to {d.get('format')} ({usages})", None
        if event.kind == "alias_sync":
            return owner, owner, f"re-sync alias {member} to {d.get('target')}", None
        if event.kind == "cache_refresh":
            return "Fuser", "Fuser", f"refresh parameter cache ({d.get('reason')}, {d.get('num_params')} params)", None
        if event.kind == "backward_selection":
            return "Fuser", "Fuser", f"first op requiring backward = {d.get('first_op_requiring_backward')}", None
        if event.kind == "fusion_plan":
            plan = f"forward [{', '.join(d.get('forward', []))}], backward [{', '.join(d.get('backward', []))}]"
            return "Fuser", "Fuser", "apply fusions", plan
        if event.kind == "forward_op":
            return "Fuser", owner, f"forward (basic ops {_fmt(d.get('basic_ops', []))})", None
        if event.kind == "backward_op":
            return "Autograd", owner, f"backward (basic ops {_fmt(d.get('basic_ops', []))})", None
        if event.kind == "scale_update":
            return "Fuser", "Fuser", f"update scales, {event.subject}, {d.get('states')} states", None
        extra = ", ".join(f"{k}={_fmt(v)}" for k, v in d.items())
        return "User", owner, f"{event.kind} {event.subject}" + (f" ({extra})" if extra else ""), None

    @staticmethod
    def _mermaid_id(name: str, taken: set[str]) -> str:
        """A Mermaid identifier for ``name``: ASCII word characters, not a keyword, not taken."""
        ident = "".join(c if (c.isascii() and c.isalnum()) or c == "_" else "_" for c in name) or "op"
        if ident[0].isdigit() or ident.lower() in trace._MERMAID_KEYWORDS:
            ident = f"op_{ident}"
        while ident in taken:
            ident += "_"
        return ident

    @staticmethod
    def _mermaid_text(text: str) -> str:
        """``text`` with every character that Mermaid could read as syntax replaced by a space."""
        safe = trace._MERMAID_SAFE_PUNCTUATION
        return "".join(c if (c.isascii() and c.isalnum()) or c in safe else " " for c in text).strip()
