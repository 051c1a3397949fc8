"""What several test modules share: helpers that make run folders and open pages (fixtures are in
tests/conftest.py)."""
