"""The lifecycle trace: its text and Mermaid renderings of a real first forward, and its filters.

The events come from the real code paths (nothing here records them by hand,
except the tests of the renderer's escaping), so the order checked here is the
order the fuser really runs: the corrected order of TE PR 3327.
"""

from __future__ import annotations

import re

import pytest
import torch

import refops as te
from refops.trace import EVENT_KINDS, Event, record

FIRST_FORWARD_ORDER = [
    "recipe_state",
    "first_forward_hook",
    "materialize",
    "cache_refresh",
    "backward_selection",
    "fusion_plan",
]

# How the Mermaid rendering labels each event kind (the start of the arrow's label).
MERMAID_LABELS = {
    "recipe_state": "reset_recipe_state(",
    "first_forward_hook": "pre_first_fuser_forward()",
    "materialize": "materialize ",
    "cache_refresh": "refresh parameter cache",
    "backward_selection": "first op requiring backward",
    "fusion_plan": "apply fusions",
    "forward_op": "forward ",
    "backward_op": "backward ",
}

# ------------------------------------------------------------ a Mermaid line validator
_ID = r"[A-Za-z_][A-Za-z0-9_]*"
_TEXT = r"[A-Za-z0-9 _.,()\[\]=+/:-]+"
_STATEMENTS = {
    "header": re.compile(r"sequenceDiagram"),
    "participant": re.compile(rf"    participant (?P<id>{_ID})(?: as (?P<alias>{_TEXT}))?"),
    "arrow": re.compile(rf"    (?P<src>{_ID})->>(?P<dst>{_ID}): (?P<text>{_TEXT})"),
    "note": re.compile(rf"    Note over (?P<id>{_ID}): (?P<text>{_TEXT})"),
}
_KEYWORDS = {"end", "participant", "loop", "alt", "else", "opt", "par", "and", "rect", "note", "over", "as"}


def parse_mermaid(source: str) -> list[tuple[str, re.Match]]:
    """``(statement kind, match)`` per line; fails the test on any line that is not an allowed statement.

    Also checks that the diagram starts with its header, that participants are
    declared once and before use, and that no id is a Mermaid keyword.
    """
    parsed, declared = [], set()
    for number, line in enumerate(source.split("\n"), 1):
        kinds = [kind for kind, pattern in _STATEMENTS.items() if pattern.fullmatch(line)]
        assert len(kinds) == 1, f"line {number} is not an allowed Mermaid statement: {line!r}"
        match = _STATEMENTS[kinds[0]].fullmatch(line)
        assert (kinds[0] == "header") == (number == 1), f"line {number}: the header must come first, once"
        if kinds[0] == "participant":
            ident = match["id"]
            assert ident not in declared and ident.lower() not in _KEYWORDS, line
            declared.add(ident)
        used = {"arrow": ("src", "dst"), "note": ("id",)}.get(kinds[0], ())
        for group in used:
            assert match[group] in declared, f"line {number} uses undeclared participant {match[group]!r}"
        parsed.append((kinds[0], match))
    return parsed


def _first_forward_trace(device: torch.device, **trace_kwargs) -> te.trace:
    model = te.ops.Sequential(te.ops.Linear(8, 4, device="meta"))
    x = torch.randn(2, 8, device=device)
    with te.trace(**trace_kwargs) as t:
        model(x).sum().backward()
    return t


def _positions(kinds: list[str]) -> list[int]:
    return [kinds.index(kind) for kind in FIRST_FORWARD_ORDER]


# ---------------------------------------------------------------------- renderings
def test_text_rendering_lists_the_first_forward_in_the_corrected_order(device):
    t = _first_forward_trace(device)
    lines = t.render_text().splitlines()
    assert len(lines) == len(t.events)
    parsed = [re.fullmatch(r"\s*(\d+)\. (\w+)\s+(\S+)(?:  \((.*)\))?", line) for line in lines]
    assert all(parsed), lines
    assert [int(m[1]) for m in parsed] == list(range(1, len(lines) + 1))
    kinds = [m[2] for m in parsed]
    assert _positions(kinds) == sorted(_positions(kinds)), kinds
    dev = str(device)
    assert f"materialize        BasicLinear.weight  (device={dev}, dtype=torch.float32, kept_identity=True)" in lines[
        kinds.index("materialize")
    ]


def test_mermaid_rendering_draws_the_first_forward_in_the_corrected_order(device):
    t = _first_forward_trace(device)
    parsed = parse_mermaid(t.render_mermaid())
    arrows = [m for kind, m in parsed if kind == "arrow"]
    assert len(arrows) == len(t.events), "one arrow per event"
    kinds = []
    for arrow, event in zip(arrows, t.events):
        assert arrow["text"].startswith(MERMAID_LABELS[event.kind]), (event, arrow.string)
        kinds.append(event.kind)
    assert _positions(kinds) == sorted(_positions(kinds)), kinds
    lines = t.render_mermaid().splitlines()
    dev = str(device)
    assert "    Fuser->>Linear: pre_first_fuser_forward()" in lines
    assert f"    BasicLinear->>BasicLinear: materialize weight on {dev} (float32, same object)" in lines
    assert f"    Bias->>Bias: materialize bias on {dev} (float32, same object)" in lines
    assert "    Fuser->>Fuser: refresh parameter cache (first forward, 2 params)" in lines
    assert "    Autograd->>BasicLinear: backward (basic ops [0])" in lines


def test_mermaid_participants_are_user_fuser_the_ops_and_autograd(device):
    parsed = parse_mermaid(_first_forward_trace(device).render_mermaid())
    participants = [(m["id"], m["alias"]) for kind, m in parsed if kind == "participant"]
    assert participants == [
        ("User", None),
        ("Fuser", "OperationFuser"),
        ("BasicLinear", None),
        ("Bias", None),
        ("Linear", None),
        ("Autograd", None),
    ]


def test_mermaid_notes_show_each_fusion_plan(device):
    t = _first_forward_trace(device)
    parsed = parse_mermaid(t.render_mermaid())
    notes = [(i, m) for i, (kind, m) in enumerate(parsed) if kind == "note"]
    assert len(notes) == len(t.of_kind("fusion_plan")) == 1
    index, note = notes[0]
    assert note["id"] == "Fuser"
    assert note["text"] == "forward [BasicLinear, Bias], backward [BasicLinear, Bias]"
    assert parsed[index - 1][1]["text"] == "apply fusions", "the note follows its arrow"


def test_construction_and_replaced_objects_are_drawn(device):
    with te.trace() as t:
        op = te.ops.Linear(4, 3, device="meta")
        t.events.append(Event("materialize", "BasicLinear.weight",
                              {"device": "cpu", "dtype": "torch.bfloat16", "kept_identity": False}))
    lines = t.render_mermaid().splitlines()
    parse_mermaid("\n".join(lines))
    assert "    User->>BasicLinear: construct on meta (float32, deferred)" in lines
    assert "    Linear->>Linear: re-sync alias weight to basic_ops.0.weight" in lines
    assert "    BasicLinear->>BasicLinear: materialize weight on cpu (bfloat16, new object)" in lines
    assert op.weight.is_meta


def test_mermaid_ids_and_labels_are_escaped():
    t = te.trace()
    t.events += [
        Event("construct", "end", {"device": "meta", "dtype": "torch.float32", "deferred": True}),
        Event("forward_op", "My-Op<T>", {"basic_ops": [0, 1]}),
        Event("backward_op", "3D", {"basic_ops": [2]}),
        Event("forward_op", "User", {"basic_ops": [3]}),
        Event("checkpoint", "Bias", {"note": "a;b #x {y}"}),
    ]
    source = t.render_mermaid()
    parsed = parse_mermaid(source)
    participants = {m["id"]: m["alias"] for kind, m in parsed if kind == "participant"}
    assert participants["op_end"] == "end"
    assert participants["My_Op_T_"] == "My-Op T"
    assert participants["op_3D"] == "3D"
    assert participants["op_User"] == "User", "an op named User does not merge into the User lifeline"
    assert "    Fuser->>op_User: forward (basic ops [3])" in source.splitlines()
    assert ";" not in source and "#" not in source and "{" not in source


def test_an_empty_trace_renders_the_participants_only():
    parsed = parse_mermaid(te.trace().render_mermaid())
    assert [kind for kind, _ in parsed] == ["header"] + ["participant"] * 3


# -------------------------------------------------------------- kinds and filters
def test_unknown_event_kinds_are_refused():
    with pytest.raises(ValueError, match=r"unknown trace event kinds \['bogus'\]"):
        te.trace(kinds=["materialize", "bogus"])
    with te.trace() as t:
        with pytest.raises(ValueError, match="unknown trace event kind 'bogus'"):
            record("bogus", "BasicLinear")
    assert t.events == []
    t.events.append(Event("bogus", "BasicLinear", {}))
    with pytest.raises(ValueError, match="cannot render trace event kind 'bogus'"):
        t.render_mermaid()


@pytest.mark.parametrize("kinds", [["materialize"], ["fusion_plan", "cache_refresh"], ["backward_op"]])
def test_kinds_filter_what_is_recorded_and_drawn(kinds, device):
    everything = _first_forward_trace(device)
    t = _first_forward_trace(device, kinds=kinds)
    assert t.events == [e for e in everything.events if e.kind in kinds]
    assert t.events and {e.kind for e in t.events} == set(kinds)
    parsed = parse_mermaid(t.render_mermaid())
    assert sum(kind == "arrow" for kind, _ in parsed) == len(t.events)
    assert sum(kind == "note" for kind, _ in parsed) == len(t.of_kind("fusion_plan"))


def test_every_known_kind_renders():
    t = te.trace()
    t.events += [Event(kind, "BasicLinear.weight", {}) for kind in EVENT_KINDS]
    parsed = parse_mermaid(t.render_mermaid())
    assert sum(kind == "arrow" for kind, _ in parsed) == len(EVENT_KINDS)


def test_nested_traces_both_record(device):
    model = te.ops.Sequential(te.ops.Linear(8, 4, device="meta"))
    with te.trace(kinds=["materialize"]) as outer:
        with te.trace() as inner:
            model(torch.randn(2, 8, device=device))
    assert [e.subject for e in outer.events] == ["BasicLinear.weight", "Bias.bias"]
    assert outer.events == inner.of_kind("materialize")


# ------------------------------------------------------ one lifeline per op instance
def test_mermaid_gives_each_op_instance_its_own_lifeline(device):
    """Issue #29: two Linears were drawn on one lifeline (ops were keyed by class)."""
    model = te.ops.Sequential(te.ops.Linear(8, 8, device="meta"), te.ops.GELU(), te.ops.Linear(8, 4, device="meta"))
    with te.trace() as t:
        model(torch.randn(2, 8, device=device)).sum().backward()
    source = t.render_mermaid()
    parsed = parse_mermaid(source)
    participants = [(m["id"], m["alias"]) for kind, m in parsed if kind == "participant"]
    assert ("BasicLinear_1", "BasicLinear 1") in participants and ("BasicLinear_2", "BasicLinear 2") in participants
    assert ("Linear_1", "Linear 1") in participants and ("Linear_2", "Linear 2") in participants
    assert ("GELU", None) in participants, "a class with one instance keeps its plain name"
    lines = source.splitlines()
    dev = str(device)
    assert f"    BasicLinear_1->>BasicLinear_1: materialize weight on {dev} (float32, same object)" in lines
    assert f"    BasicLinear_2->>BasicLinear_2: materialize weight on {dev} (float32, same object)" in lines
    assert "    Fuser->>Linear_1: pre_first_fuser_forward()" in lines
    assert "    Fuser->>Linear_2: pre_first_fuser_forward()" in lines
    # the first Linear's ops run forward first and backward last
    forward = [line for line in lines if "->>BasicLinear_" in line and ": forward" in line]
    backward = [line for line in lines if "->>BasicLinear_" in line and ": backward" in line]
    assert [line.split("->>")[1].split(":")[0] for line in forward] == ["BasicLinear_1", "BasicLinear_2"]
    assert [line.split("->>")[1].split(":")[0] for line in backward] == ["BasicLinear_2", "BasicLinear_1"]


def test_events_of_one_class_keep_their_instances_apart_but_compare_equal_by_content(device):
    first = _first_forward_trace(device)
    second = _first_forward_trace(device)
    assert first.events == second.events, "the instance is not part of an event's value"
    assert first.events[0].instance is not None


def test_eager_quantized_weights_are_quantized_at_construction(device):
    with te.trace() as t, te.quantized_model_init(recipe=te.recipe.Float8CurrentScaling()):
        te.ops.Linear(32, 32, device=device)
    kinds = [(e.kind, e.subject.partition(".")[0]) for e in t.events]
    order = [("construct", "BasicLinear"), ("quantize_weight", "BasicLinear"), ("materialize", "BasicLinear")]
    assert [kinds.index(k) for k in order] == sorted(kinds.index(k) for k in order), kinds
    event = t.of_kind("quantize_weight")[0]
    assert event.subject == "BasicLinear.weight"
    assert event.details == {"format": "Float8Tensor", "recipe": "Float8CurrentScaling",
                             "usages": ["rowwise", "columnwise"]}
    lines = t.render_mermaid().splitlines()
    assert "    BasicLinear->>BasicLinear: quantize weight to Float8Tensor (rowwise, columnwise)" in lines


# ------------------------------------------------------ issue #37: the text names the recipe and the op instance
def test_recipe_state_names_the_recipe_or_none(device):
    model = te.ops.Sequential(te.ops.Linear(32, 32, device="meta"))
    with te.trace(kinds=["recipe_state"]) as plain:
        model(torch.randn(32, 32, device=device))
    assert {e.details["recipe"] for e in plain.events} == {"none"}, "high precision read recipe=NoneType"
    fp8 = te.ops.Sequential(te.ops.Linear(32, 32, device="meta"))
    with te.trace(kinds=["recipe_state"]) as quantized, te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        fp8(torch.randn(32, 32, device=device))
    assert {e.details["recipe"] for e in quantized.events} == {"Float8CurrentScaling"}


def test_text_names_each_op_instance_by_its_path_or_its_number(device):
    from refops.trace import instance_names

    model = te.ops.Sequential(te.ops.Linear(8, 8, device="meta"), te.ops.GELU(), te.ops.Linear(8, 4, device="meta"))
    with te.trace(kinds=["materialize"]) as t:
        model(torch.randn(2, 8, device=device))
    weights = [line for line in t.render_text(instance_names(model)).splitlines() if "BasicLinear.weight" in line]
    assert [line.split("(op=")[1].split(",")[0] for line in weights] == ["0.basic_ops.0", "2.basic_ops.0"]
    # Without names, the instances of a class are numbered as the Mermaid lifelines are; a lone one gets no label.
    numbered = t.render_text().splitlines()
    assert [line.split("(op=")[1].split(",")[0] for line in numbered if "BasicLinear.weight" in line] == [
        "BasicLinear 1", "BasicLinear 2"]
    one = te.ops.Sequential(te.ops.Linear(8, 4, device="meta"))
    with te.trace(kinds=["materialize"]) as alone:
        one(torch.randn(2, 8, device=device))
    assert "op=" not in alone.render_text()
    assert t.instance_labels(instance_names(model)).keys() == {e.instance for e in t.events}
