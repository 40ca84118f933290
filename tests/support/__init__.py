"""Helpers of the test suite, none of them tests: backend registries, scripted models, servers, child processes.

Imported as `support` (pytest's `pythonpath = ["tests"]`). The scripts among them (`child.py`,
`cli_zygote.py`, `crash_zygote.py`, `writer.py`, `media_writer.py`, `shared_run_writer.py`) are
run by path in a separate process and put `tests/` on `sys.path` themselves.
"""
