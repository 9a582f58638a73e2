"""`load_plans` reads plans pickled before a field existed."""
import pickle

from granisim.core.contract import BatchPlan, PlannedRequest, batch_plan, planned_request
from granisim.validation.plans import load_plans


def test_a_plan_pickled_before_its_last_fields_existed_gets_their_defaults(tmp_path, monkeypatch):
    """A plan stored before ``BatchPlan.transfers`` and ``PlannedRequest.layout`` existed (a slotted dataclass
    pickles its fields' values in order; an older class had fewer): both read back with their defaults, the
    stored fields as stored. Without the fill, reading ``plan.transfers`` raises AttributeError (the
    shipped-profile fit over machines A-C's runs stopped on it)."""
    req = planned_request(rid=7, num_new=1, context_len=40, is_prefill=False, shared_len=16)
    plan = batch_plan(step=3, policy="token", page_size=1, requests=(req,), num_steps=2)
    for cls in (BatchPlan, PlannedRequest):
        full = cls.__getstate__
        monkeypatch.setattr(cls, "__getstate__", lambda self, full=full: full(self)[:-1])
    path = tmp_path / "plans.pkl"
    path.write_bytes(pickle.dumps([plan]))
    monkeypatch.undo()
    assert not hasattr(pickle.loads(path.read_bytes())[0], "transfers")  # what an old file reads as
    (got,) = load_plans(path)
    assert got.transfers == () and got.num_steps == 2 and got.step == 3
    assert got.requests[0].layout is None and got.requests[0].shared_len == 16
