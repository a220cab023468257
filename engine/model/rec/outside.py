"""A rec unit's layer read outside its rec layer: ``"<rec>/<unit layer>"`` as a source.

2019-e2e-speech-to-text-comparison's triangle models attend in their second decoder to the first one's
``readout`` (``{"class": "copy", "from": "output2/readout"}``): the unit layer's output on every step of
the first decoder's loop, which in training runs over its target's labels, with their lengths. A search
would need the first decoder's searched hypotheses there: refused (``NetworkModel``).
"""
from __future__ import annotations

from engine.model.layers.base import Layer
from engine.model.rec.subnet import RecSubnet
from engine.runtime.errors import ConfigError


class UnitOutput(Layer):
    def __init__(self, name: str, rec: RecSubnet, unit_layer: str) -> None:
        template = rec.templates[unit_layer]
        if template.axes or template.sparse:
            raise ConfigError(f"Network layer '{name}' reads unit layer '{unit_layer}' of "
                              f"'{rec.layer_name}', which is {template.describe()} per step; read outside "
                              "its rec layer here are features of one step (no attention axes, no class "
                              "ids).")
        super().__init__(template.dim)
        self.rec_name, self.unit_layer = rec.layer_name, unit_layer
        rec.read_outside.add(unit_layer)
