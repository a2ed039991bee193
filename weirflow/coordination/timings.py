"""The protocol's timings (`CoordinationTimings`), by the name the protocol's modules import them.

The type lives in the interfaces (`weirflow.interfaces.timings`): the core reads it once from config and passes
it to the coordinator factory, so a backend sees the same values without importing the protocol.
"""

from weirflow.interfaces.timings import MARGIN_KEY, CoordinationTimings

__all__ = ["MARGIN_KEY", "CoordinationTimings"]
