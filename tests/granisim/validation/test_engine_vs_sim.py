"""`granisim validation engine-vs-sim --fit`: the per-unit table of the re-read value each grid unit wants."""
from granisim.validation.engine_vs_sim import per_unit_values


def test_each_unit_gets_the_value_at_which_its_price_meets_its_measurement():
    """Prices rising with the value: the unit measured 2.5 between prices 2 (at 0.5) and 3 (at 1.0) wants 0.75
    (linear between the values tried, in whatever order they were tried); a measurement outside the tried range
    gets '-', not the nearest end."""
    units = [(16384, 4, "token", 2.5), (4096, 1, "paged16", 9.0)]
    priced = {1.0: [3.0, 4.0], 0.5: [2.0, 3.0]}
    lines = per_unit_values(units, priced).splitlines()
    assert lines[2] == "| 16384 | 4 | token | 2.500 | 0.75 |"
    assert lines[3] == "| 4096 | 1 | paged16 | 9.000 | - |"
