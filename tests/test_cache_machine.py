"""The reference cache survives the cache-level stateful machine."""

from kvoracle.oracle.cache_machine import CacheMachine

TestReferenceCache = CacheMachine.TestCase
