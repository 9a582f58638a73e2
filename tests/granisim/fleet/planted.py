"""A fleet with one deliberate bug: the fault property test must catch it."""

from granisim.fleet.loop import FleetLoop


class DropsOneReroute(FleetLoop):
    """A failing replica's first handed-back request is never routed again (lost)."""

    def _route(self, spec):
        if self.rerouted.get(spec.rid) == 1 and not getattr(self, "_dropped", False):
            self._dropped = True  # BUG
            return
        super()._route(spec)
