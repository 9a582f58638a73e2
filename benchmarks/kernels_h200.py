"""Entry point: `python3 benchmarks/kernels_h200.py --out DIR` (see gpu_backend/bench/kernels_h200.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpu_backend.bench.kernels_h200 import main  # noqa: E402

if __name__ == "__main__":
    main()
