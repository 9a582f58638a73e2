"""The in-engine decode probe's pure parts: compacting slot ids, reading its --units."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gpu_backend.bench.decode_in_situ import compacted, main  # noqa: E402
from gpu_backend.kernels import layout as L  # noqa: E402


def test_compacted_renumbers_by_first_use_and_keeps_sharing():
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    # two sequences share a prefix (90, 91, 50); each has its own last slots
    kv = L.SlotLists(i32([0, 4, 8]), i32([90, 91, 50, 7, 90, 91, 50, 200]))
    new, (ids, distinct, span, runs) = compacted(kv)
    assert new.indices.tolist() == [0, 1, 2, 3, 0, 1, 2, 4] and new.indptr is kv.indptr
    assert (ids, distinct, span, runs) == (8, 5, 194, 6)
    pages = L.PageTable(i32([0, 2, 4]), i32([9, 3, 9, 5]), i32([30, 32]), 16)
    packed, _ = compacted(pages)
    assert packed.indices.tolist() == [0, 1, 0, 2] and packed.lens is pages.lens and packed.page_size == 16


@pytest.mark.parametrize("unit, why", [("multi_agent_16k:token", "expected workload:policy:model"),
                                       ("nope:token:llama-3.1-8b", "unknown workload"),
                                       ("multi_agent_16k:token:nope", "unknown model"),
                                       ("multi_agent_16k:nopol:llama-3.1-8b", "unknown policy")])
def test_bad_units_exit_2_naming_the_value(tmp_path, capsys, unit, why):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path), "--units", unit])
    err = capsys.readouterr().err
    assert e.value.code == 2 and why in err and repr(unit) in err and not (tmp_path / "in_situ.csv").exists()
