"""Makes the shared helpers in gb_util.py importable from every test module below."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
