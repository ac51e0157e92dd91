"""kvoracle: the formally specified KV-cache block lifecycle, and a checker for engines.

One import name holds everything: kvoracle.spec (the model), kvoracle.kvcache and
kvoracle.scheduler (the reference), kvoracle.oracle (machines, adapters, CLI),
kvoracle.proofs, and kvoracle.testing (the machines for an engine's own test suite).
In the repository the subpackages are the top-level folders; kvoracle/ links to them.
"""

__version__ = "0.2.0"
