"""The paper page's claims table (granisim paper)."""
from granisim.experiments.paper import _claims_table


def test_claims_table_renders_one_line_per_claim():
    """One markdown line per claim with the ratio in bold, under the six-column header. Planted bug: a second
    helper of the same name defined later in the module (the table helper the extra tables use) shadowed this
    one and `granisim paper` stopped with a TypeError after its simulations."""
    rows = [{"claim": "k = 4: granikv / token", "paper": "2.16x", "ours": 2.3812, "extra": "vs paged16 2.16x",
             "terms": "attn_decode 151.0→11.0 s"}]
    assert _claims_table(rows).split("\n") == [
        "| claim | paper | ours | detail | terms that moved most (baseline → target, s over the run) | "
        "reading (from the same rows) |",
        "| --- | --- | --- | --- | --- | --- |",
        "| k = 4: granikv / token | 2.16x | **2.38x** | vs paged16 2.16x | attn_decode 151.0→11.0 s |  |"]
