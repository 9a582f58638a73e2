"""Predicted vs measured: the real engine's runs on a GPU, and the reports built from them on a CPU."""
