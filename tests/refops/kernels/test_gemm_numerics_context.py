"""refops.gemm_numerics as a context: entering, leaving, threads, what a backward captures, and every misuse
a clear error naming ``gemm_numerics``. None of this computes a Hopper GEMM, so none of it needs mmaemu."""

from __future__ import annotations

import threading

import pytest

import refops
from refops.kernels.gemm_numerics import GemmNumericsSetting, forward_numerics, numerics_in_force

HOPPER = GemmNumericsSetting("hopper", 1)


# ------------------------------------------------------------------ the context


def test_default_is_exact_and_the_context_sets_and_restores():
    assert refops.gemm_numerics() == "exact"
    with refops.gemm_numerics("hopper") as name:
        assert name == "hopper" and refops.gemm_numerics() == "hopper"
        with refops.gemm_numerics("exact"):
            assert refops.gemm_numerics() == "exact"
        assert refops.gemm_numerics() == "hopper"
    assert refops.gemm_numerics() == "exact"


def test_the_context_restores_on_error():
    with pytest.raises(KeyError):
        with refops.gemm_numerics("hopper"):
            raise KeyError
    assert refops.gemm_numerics() == "exact"


def test_outside_a_backward_the_mode_is_process_wide():
    seen = []
    with refops.gemm_numerics("hopper"):
        t = threading.Thread(target=lambda: seen.append(refops.gemm_numerics()))
        t.start()
        t.join()
    assert seen == ["hopper"]


def test_concurrent_entries_leave_the_default_behind():
    barrier = threading.Barrier(8)
    errors = []

    def worker(i):
        try:
            barrier.wait()
            for _ in range(50):
                with refops.gemm_numerics("hopper" if i % 2 else "exact"):
                    assert refops.gemm_numerics() in ("hopper", "exact")
        except Exception as error:  # pragma: no cover
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert refops.gemm_numerics() == "exact"  # every context closed: nothing stale, whatever the exit order


def test_contexts_left_out_of_order_remove_only_themselves():
    first, second = refops.gemm_numerics("hopper"), refops.gemm_numerics("exact")
    first.__enter__()
    second.__enter__()
    assert refops.gemm_numerics() == "exact"
    first.__exit__(None, None, None)  # another thread's context closes first
    assert refops.gemm_numerics() == "exact"
    second.__exit__(None, None, None)
    assert refops.gemm_numerics() == "exact"
    first.__enter__()
    assert refops.gemm_numerics() == "hopper"
    first.__exit__(None, None, None)
    assert refops.gemm_numerics() == "exact"


# ------------------------------------------------------------------ misuse
@pytest.mark.parametrize("name", ["Hopper", "tf32", "", "exact ", 1, b"hopper", ("hopper",)])
def test_an_unknown_or_mistyped_name_is_a_value_error_naming_gemm_numerics(name):
    with pytest.raises(ValueError, match=r"^gemm_numerics: "):
        refops.gemm_numerics(name)


@pytest.mark.parametrize("split_k", [2, 0, -1, 1.0, True, "AUTO", "1", None, [1]])
def test_split_k_takes_1_or_auto_only(split_k):
    with pytest.raises(ValueError, match=r"^gemm_numerics: split_k must be 1 .* or 'auto'"):
        refops.gemm_numerics("hopper", split_k=split_k)


def test_split_k_auto_is_for_hopper_only():
    with pytest.raises(ValueError, match=r"^gemm_numerics: split_k='auto' applies to 'hopper' only"):
        refops.gemm_numerics("exact", split_k="auto")
    with refops.gemm_numerics("hopper", split_k="auto") as name:
        assert name == "hopper"
    with refops.gemm_numerics("exact", split_k=1) as name:
        assert name == "exact"


@pytest.mark.parametrize("split_k", ["auto", 2])
def test_split_k_without_a_name_is_a_type_error_not_a_mode_read(split_k):
    """It used to return the string "exact", so `with gemm_numerics(split_k="auto"):` failed far from the cause."""
    with pytest.raises(TypeError, match=r"^gemm_numerics: split_k=.* needs a mode name"):
        refops.gemm_numerics(split_k=split_k)
    assert refops.gemm_numerics(split_k=1) == "exact"  # the default spelled out is still a read


def test_with_on_the_name_read_says_it_is_no_context():
    name = refops.gemm_numerics()
    assert name == "exact" and isinstance(name, str) and str(name) == "exact"
    with pytest.raises(TypeError, match=r"^gemm_numerics\(\) with no name returns the mode in force \('exact'\)"):
        with refops.gemm_numerics():
            pass
    assert refops.gemm_numerics() == "exact"


def test_a_positional_split_k_is_refused_by_python_naming_gemm_numerics():
    with pytest.raises(TypeError, match="gemm_numerics"):
        refops.gemm_numerics("hopper", "auto")


def test_a_context_left_more_often_than_entered_is_a_runtime_error():
    context = refops.gemm_numerics("hopper")
    with pytest.raises(RuntimeError, match=r"^gemm_numerics\('hopper'\): left more often than entered"):
        context.__exit__(None, None, None)
    with context:
        assert refops.gemm_numerics() == "hopper"
    with pytest.raises(RuntimeError, match="left more often than entered"):
        context.__exit__(None, None, None)
    assert refops.gemm_numerics() == "exact"


def test_misuse_raises_before_any_state_changes():
    for bad in (lambda: refops.gemm_numerics("tf32"), lambda: refops.gemm_numerics("hopper", split_k=4),
                lambda: refops.gemm_numerics(split_k="auto")):
        with pytest.raises((TypeError, ValueError)):
            bad()
        assert refops.gemm_numerics() == "exact" and numerics_in_force() == ("exact", 1)


# ------------------------------------------------------------------ a backward's captured mode
def test_numerics_in_force_carries_split_k():
    assert numerics_in_force() == GemmNumericsSetting("exact", 1)
    with refops.gemm_numerics("hopper", split_k="auto"):
        assert numerics_in_force() == GemmNumericsSetting("hopper", "auto")


def test_a_captured_mode_wins_over_open_contexts_and_is_restored():
    with refops.gemm_numerics("exact"):
        with forward_numerics(HOPPER):
            assert refops.gemm_numerics() == "hopper"
            with refops.gemm_numerics("exact"):  # the backward's forward decides, not a context inside it
                assert refops.gemm_numerics() == "hopper"
            with forward_numerics(GemmNumericsSetting("exact", 1)):  # a backward nested in a backward
                assert refops.gemm_numerics() == "exact"
            assert refops.gemm_numerics() == "hopper"
        assert refops.gemm_numerics() == "exact"
    with pytest.raises(KeyError):
        with forward_numerics(HOPPER):
            raise KeyError
    assert refops.gemm_numerics() == "exact"


def test_a_captured_mode_is_seen_by_its_own_thread_only():
    inside, started, release = [], threading.Event(), threading.Event()

    def backward_thread():
        with forward_numerics(HOPPER):
            inside.append(refops.gemm_numerics())
            started.set()
            release.wait(10)

    t = threading.Thread(target=backward_thread)
    t.start()
    assert started.wait(10)
    try:
        assert refops.gemm_numerics() == "exact"  # this thread's forwards keep the process-wide mode
    finally:
        release.set()
        t.join()
    assert inside == ["hopper"]


def test_forward_numerics_takes_a_captured_setting_only():
    with pytest.raises(TypeError, match=r"^gemm_numerics: forward_numerics takes a GemmNumericsSetting"):
        with forward_numerics(("hopper", 1)):
            pass
