"""Never run: dstk launch refuses the launches that name it (tests/test_bad_inputs.py)."""
