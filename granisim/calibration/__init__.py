"""Calibration: fit a hardware profile's coefficients from raw GPU measurements
(``python -m calibration.measure`` writes them; ``granisim calibrate fit RAW_DIR`` fits)."""
