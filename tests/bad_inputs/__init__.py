"""A survey of bad inputs (issue 49): malformed and invalid models, models that exhaust resources, tampered caches,
tuning logs and cost-model files, bad CLI usage and bad feeds, each fed to cinn in a worker process (a few command
lines as `python -m`) and classified (ok, crash, traceback, code execution, hang, bad message, ...).

`python -m tests.bad_inputs [--category C] [--markdown]` prints the table; tests/test_bad_inputs.py asserts that every
case passes. Each case's input is made in its own folder (with the tiny model and a copy of a warm cache); payloads
that would run code create a marker file there.
"""
