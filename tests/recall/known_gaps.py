"""Where the current oracle misses a bug or fails a correct twin, and which capability is missing.

The ONE place that says so: ``test_recall.py`` marks these parameters ``xfail(strict=True)`` and the
docs table prints the reasons. When the oracle gains the capability, the strict xfail fails; delete
the entry here and the docs table updates itself (``test_docs_table_is_current`` says how).
"""

#: case name -> why the oracle does not catch the bug
MISSED_BUGS: dict[str, str] = {}

#: case name -> why the oracle fails the correct twin (a false alarm)
FAILED_TWINS: dict[str, str] = {}
