"""What a run is made of, as data: the scenario schema, model shapes, hardware profiles with their
coefficients and sources, and the shipped data files (traces, measured tables, the demo scenario)."""
