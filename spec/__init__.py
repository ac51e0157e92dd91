"""The abstract model of the KV-cache block lifecycle: pure functions over frozen values.

spec/ depends on nothing else in kvoracle. Read types.py, state.py, actions.py and
invariants.py in that order; scheduler.py adds the request lifecycle on top.
"""
