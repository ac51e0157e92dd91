"""The abstract model of the KV-cache block lifecycle: pure functions over frozen values.

spec/ depends on nothing else in kvoracle. Read it as a TLA+ specification, in this
order: types.py (identifiers, owners, outcomes), state.py (VARIABLES and Init),
actions.py (the cache's actions), scheduler.py (the system's actions), next.py (Next,
within a scope), view.py (what a checker knows of a state), invariants.py and
liveness.py (every property, once), properties.py (the IDs and their definitions).
"""
