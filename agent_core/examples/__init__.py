"""Example agents that ship with the package."""
