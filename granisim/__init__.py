"""granisim: a SimPy simulator of LLM serving with the GraniKV KV-cache layout.

Importing granisim never imports torch or triton.
"""

__version__ = "0.1.0"
