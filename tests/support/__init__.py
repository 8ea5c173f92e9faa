"""What several test modules share: fixtures (made global by tests/conftest.py) and helpers."""
