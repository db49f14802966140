"""Checked-in generators of the test vectors (``python -m vectors.gen``)."""
